// constant_inputs (Note [Constant inputs]): forward's non-tensor arguments are
// baked in with the spec's values or their defaults, checked against their types.
#include "stage/constant_inputs.h"

#include <gtest/gtest.h>
#include <torch/script.h>

#include <map>
#include <string>
#include <vector>

#include "partitioner/split_spec.h"
#include "stage/run_chained.h"
#include "stage/split_in_memory.h"

namespace pipeforge::stage {
namespace {

torch::jit::Module typedArguments() {
  torch::jit::Module inner("Inner");
  inner.register_parameter("v", torch::full({3}, 0.5), false);
  inner.define("def forward(self, y):\n    return y * self.v\n");
  torch::jit::Module root("Typed");
  root.register_parameter("w", torch::full({3}, 1.5), false);
  root.register_module("inner", inner);
  root.define(R"(
def forward(self, x, n: int, sizes: List[int], mode: str, eps: Optional[float] = None, flag: bool = True):
    y = x * self.w * n
    if mode == "double":
        y = y * 2.0
    if eps is not None:
        y = y + eps
    if flag:
        y = y + float(len(sizes))
    return self.inner.forward(y)
)");
  return root;
}

std::vector<partitioner::ConstantInput> constants(const std::string& yaml_map) {
  return partitioner::parseSplitSpec("constant_inputs: " + yaml_map + "\n", "t.yaml").constant_inputs;
}

TEST(ConstantInputs, BakesGivenValuesAndDefaultsOutOfTheSignature) {
  struct Case {
    std::string given;
    std::vector<c10::IValue> call;  // the original forward's non-tensor arguments
    std::map<std::string, std::string> baked;
  };
  const std::vector<Case> cases = {
      {"{n: 2, sizes: [4, 5, 6], mode: double, eps: 0.5}",
       {int64_t{2}, c10::List<int64_t>({4, 5, 6}), std::string("double"), 0.5, true},
       {{"n", "2"}, {"sizes", "[4,5,6]"}, {"mode", "\"double\""}, {"eps", "0.5"}, {"flag", "true"}}},
      {"{n: 3, sizes: [], mode: single, eps: null, flag: false}",
       {int64_t{3}, c10::List<int64_t>(), std::string("single"), c10::IValue(), false},
       {{"n", "3"}, {"sizes", "[]"}, {"mode", "\"single\""}, {"eps", "null"}, {"flag", "false"}}},
  };
  torch::jit::Module model = typedArguments();
  const at::Tensor x = torch::arange(3, torch::kFloat);
  for (const auto& c : cases) {
    std::map<std::string, std::string> baked;
    torch::jit::Module out = bakeConstantInputs(model, constants(c.given), baked);
    EXPECT_EQ(baked, c.baked) << c.given;
    EXPECT_EQ(out.get_method("forward").function().getSchema().arguments().size(), 2u) << "self and x";
    EXPECT_EQ(model.get_method("forward").function().getSchema().arguments().size(), 7u) << "the model is unchanged";
    std::vector<c10::IValue> args{x};
    args.insert(args.end(), c.call.begin(), c.call.end());
    EXPECT_TRUE(torch::equal(out.forward({x}).toTensor(), model.forward(args).toTensor())) << c.given;
    EXPECT_TRUE(out.attr("w").toTensor().is_same(model.attr("w").toTensor())) << "parameters are shared";
  }
}

TEST(ConstantInputs, RefusalsNameTheArgumentTheTypeAndTheFix) {
  const std::string arguments =
      "forward's non-tensor arguments are n (int), sizes (List[int]), mode (str), eps (Optional[float] = None), "
      "flag (bool = True)";
  struct Case {
    std::string given;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases = {
      {"{n: 2.5, sizes: [1], mode: a}", {"t.yaml:1: constant_inputs.n: forward takes an int, got '2.5'"}},
      {"{n: 2, sizes: 3, mode: a}", {"constant_inputs.sizes: forward takes a List[int], got '3'"}},
      {"{n: 2, sizes: [1, a], mode: a}", {"constant_inputs.sizes: forward takes a List[int], got [1, a]"}},
      {"{n: 2, sizes: [1], mode: null}", {"constant_inputs.mode: forward takes a str, got null"}},
      {"{n: 2, sizes: [1], mode: a, eps: small}", {"constant_inputs.eps: forward takes an Optional[float], got 'small'"}},
      {"{n: 2, sizes: [1], mode: a, flag: maybe}", {"constant_inputs.flag: forward takes a bool, got 'maybe'"}},
      {"{n: 2, sizes: [1], mode: a, x: 1.0}",
       {"constant_inputs.x: 'x' is a Tensor argument of forward, which the data gives, not a constant", arguments}},
      {"{n: 2, sizes: [1], mode: a, m: 1}", {"constant_inputs.m: forward has no argument 'm'", arguments}},
      {"{sizes: [1], mode: a}",
       {"forward's argument 'n' is an int with no default", "constant_inputs: {n: ...}", "under model:"}},
  };
  torch::jit::Module model = typedArguments();
  for (const auto& c : cases) {
    std::map<std::string, std::string> baked;
    try {
      bakeConstantInputs(model, constants(c.given), baked);
      ADD_FAILURE() << "accepted: " << c.given;
    } catch (const partitioner::SpecError& e) {
      for (const auto& f : c.fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
    }
  }
}

TEST(ConstantInputs, TensorOnlyModelsStayAsTheyAre) {
  torch::jit::Module root("TensorsOnly");
  root.define("def forward(self, x, mask: Optional[Tensor] = None):\n    return x\n");
  std::map<std::string, std::string> baked;
  torch::jit::Module out = bakeConstantInputs(root, {}, baked);
  EXPECT_TRUE(baked.empty());
  EXPECT_EQ(out.type(), root.type()) << "no copy without non-tensor arguments";
  try {
    bakeConstantInputs(root, constants("{scale: 2.0}"), baked);
    ADD_FAILURE() << "accepted a constant for a model without non-tensor arguments";
  } catch (const partitioner::SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("forward takes no non-tensor argument"), std::string::npos) << e.what();
  }
}

TEST(ConstantInputs, SplitRecordsThemAndNoStageTakesThem) {
  auto spec = partitioner::parseSplitSpec(
      "split_points: {inner: BEGINNING}\nexample_inputs: [{shape: [3]}]\n"
      "constant_inputs: {n: 2, sizes: [1, 2], mode: double}\n",
      "t.yaml");
  auto result = splitInMemory(typedArguments(), spec);
  const PipeManifest& m = result.stages.manifest;
  EXPECT_EQ(m.inputs, std::vector<std::string>{"x"});
  EXPECT_EQ(m.constant_inputs, (std::map<std::string, std::string>{
                                   {"n", "2"}, {"sizes", "[1,2]"}, {"mode", "\"double\""}, {"eps", "null"},
                                   {"flag", "true"}}));
  const at::Tensor x = torch::arange(3, torch::kFloat);
  auto outs = runChained(result.stages.modules, m, {x});
  auto want = typedArguments().forward({x, int64_t{2}, c10::List<int64_t>({1, 2}), std::string("double")});
  EXPECT_TRUE(torch::equal(outs.at(0), want.toTensor()));
  ASSERT_EQ(m.num_stages, 2);
  for (const auto& module : result.stages.modules) {
    EXPECT_EQ(module.get_method("forward").function().getSchema().arguments().size(), 2u) << "self and one input";
  }
  EXPECT_EQ(m.stages[0].output_meta.size(), 1u) << "example_inputs (x alone) ran the baked model";
}

}  // namespace
}  // namespace pipeforge::stage
