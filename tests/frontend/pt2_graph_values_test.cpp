// What the graph signature says each value is, and the signatures no stage
// could run, each refused with the file named first.
#include "frontend/pt2_graph_values.h"

#include <gtest/gtest.h>

#include "frontend/errors.h"
#include "frontend/pt2_archive.h"

namespace pipeforge::frontend {
namespace {

using Strings = std::vector<std::string>;

Pt2InputSpec input(Pt2InputKind kind, const std::string& value, const std::string& target = "") {
  Pt2InputSpec in;
  in.kind = kind;
  in.value = value;
  in.target = target;
  return in;
}

Pt2OutputSpec output(Pt2OutputKind kind, const std::string& value, const std::string& target = "") {
  Pt2OutputSpec out;
  out.kind = kind;
  out.value = value;
  out.target = target;
  return out;
}

std::string refusal(const Pt2Signature& signature) {
  try {
    readPt2GraphValues(signature, "m.pt2", [](const std::string&) {});
  } catch (const Pt2Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(Pt2GraphValues, EachValueHasItsRole) {
  Pt2Signature sig;
  sig.inputs = {input(Pt2InputKind::kParameter, "p_fc_weight", "fc.weight"),
                input(Pt2InputKind::kBuffer, "b_bn_mean", "bn.mean"), input(Pt2InputKind::kConstantInput, "flag"),
                input(Pt2InputKind::kUserInput, "x"), input(Pt2InputKind::kUserInput, "n")};
  sig.outputs = {output(Pt2OutputKind::kBufferMutation, "add", "bn.mean"), output(Pt2OutputKind::kUserOutput, "y")};
  Strings required;
  Pt2GraphValues values =
      readPt2GraphValues(sig, "m.pt2", [&](const std::string& fqn) { required.push_back(fqn); });
  EXPECT_EQ(required, (Strings{"fc.weight", "bn.mean"}));
  EXPECT_EQ(values.user_inputs, (Strings{"x", "n"}));
  EXPECT_EQ(values.user_outputs, Strings{"y"});
  EXPECT_EQ(values.placeholder_fqn.at("p_fc_weight"), "fc.weight");
  EXPECT_EQ(values.fqn_placeholder.at("bn.mean"), "b_bn_mean");
  EXPECT_EQ(values.mutations, (std::map<std::string, std::string>{{"add", "bn.mean"}}));
  EXPECT_TRUE(values.aliases.empty());
}

TEST(Pt2GraphValues, AMissingPayloadIsTheArchivesError) {
  Pt2Signature sig;
  sig.inputs = {input(Pt2InputKind::kBuffer, "b_mean", "mean")};
  auto missing = [](const std::string& fqn) -> void { throw Pt2Error("no payload for '" + fqn + "'"); };
  try {
    readPt2GraphValues(sig, "m.pt2", missing);
    FAIL() << "expected a Pt2Error";
  } catch (const Pt2Error& e) {
    EXPECT_STREQ(e.what(), "no payload for 'mean'");
  }
}

TEST(Pt2GraphValues, WhatNoStageCanRunIsRefused) {
  Pt2Signature object;
  object.inputs = {input(Pt2InputKind::kCustomObject, "obj", "packed")};
  EXPECT_EQ(refusal(object), "'m.pt2': input 'obj' is a TorchBind script object (packed); pipeforge splits models "
                             "whose state is tensors only");
  Pt2Signature literal_in;
  literal_in.inputs = {input(Pt2InputKind::kUserInput, "")};
  EXPECT_EQ(refusal(literal_in),
            "'m.pt2': a user input is not a tensor or symbolic value; export with tensor inputs");
  Pt2Signature literal_out;
  literal_out.outputs = {output(Pt2OutputKind::kUserOutput, "y"), output(Pt2OutputKind::kUserOutput, "")};
  literal_out.outputs[1].literal = R"({"as_int": 3})";
  EXPECT_EQ(refusal(literal_out),
            "'m.pt2': forward's output 1 is {\"as_int\": 3}, not a tensor; pipeforge splits models whose outputs are "
            "tensors: return only tensors from forward (compute sizes outside the model)");
  Pt2Signature joint;
  joint.outputs = {output(Pt2OutputKind::kLossOutput, "loss")};
  EXPECT_EQ(refusal(joint), "'m.pt2': the file holds a joint forward-backward graph (loss/gradient outputs); export "
                            "the forward only with torch.export.export(model, args)");
  Pt2Signature in_place;
  in_place.outputs = {output(Pt2OutputKind::kUserInputMutation, "x_new", "x")};
  EXPECT_EQ(refusal(in_place), "'m.pt2': forward mutates its input 'x' in place; pipeforge stages cannot write back "
                               "to inputs, so return the new value instead");
  Pt2Signature token;
  token.inputs = {input(Pt2InputKind::kToken, "token")};
  EXPECT_EQ(refusal(token), "'m.pt2': the program threads effect tokens (ops with side effects); export without "
                            "effectful custom ops");
}

TEST(Pt2GraphValues, ATiedAliasInsideTheModuleIsReachable) {
  Pt2GraphValues values;
  values.aliases = {{"wte.weight", {"wte.weight", "lm_head.weight"}}};
  EXPECT_EQ(reachableAlias(values, "wte.weight", "lm_head"), std::optional<std::string>("lm_head.weight"));
  EXPECT_EQ(reachableAlias(values, "wte.weight", ""), std::optional<std::string>("wte.weight"));
  EXPECT_EQ(reachableAlias(values, "wte.weight", "blocks.0"), std::nullopt);
  EXPECT_EQ(reachableAlias(values, "wpe.weight", "blocks.0"), std::nullopt);
}

}  // namespace
}  // namespace pipeforge::frontend
