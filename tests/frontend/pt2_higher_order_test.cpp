// PT2 higher-order ops in messages: a region is named by its mode, its
// module and its first body line; an unsupported op by its name and its fix.
#include "frontend/pt2_higher_order.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace pipeforge::frontend {
namespace {

using json = nlohmann::ordered_json;

json withTrace(const std::string& file, int line) {
  return {{"stack_trace", "File \"/x/" + file + "\", line " + std::to_string(line) + ", in forward\n    y = f(x)"}};
}

// A wrap_with_set_grad_enabled node whose body's second node has a stack trace.
json gradRegion(bool enable) {
  json body = {{"nodes", json::array({json{{"target", "torch.ops.aten.cos.default"}, {"metadata", json::object()}},
                                      json{{"target", "torch.ops.aten.sin.default"},
                                           {"metadata", withTrace("modeling_llama.py", 98)}}})}};
  return {{"target", "torch.ops.higher_order.wrap_with_set_grad_enabled"},
          {"inputs", json::array({json{{"name", "enable"}, {"arg", {{"as_bool", enable}}}},
                                  json{{"name", "body"}, {"arg", {{"as_graph", {{"graph", body}}}}}}})}};
}

TEST(Pt2HigherOrder, TheBodyFollowsTheModeArguments) {
  EXPECT_EQ(pt2RegionBodyInput(Pt2RegionKind::kGradMode), 1u);
  EXPECT_EQ(pt2RegionBodyInput(Pt2RegionKind::kAutocast), 4u);
}

TEST(Pt2HigherOrder, ARegionIsNamedByItsModeModuleAndFirstBodyLine) {
  EXPECT_EQ(describePt2Region(gradRegion(false), Pt2RegionKind::kGradMode, "model.rotary_emb"),
            "a torch.no_grad() region of model.rotary_emb (modeling_llama.py:98)");
  json enabled = gradRegion(true);
  enabled["metadata"] = withTrace("net.py", 7);  // the op's own line comes first
  EXPECT_EQ(describePt2Region(enabled, Pt2RegionKind::kGradMode, ""),
            "a torch.enable_grad() region of forward (net.py:7)");
}

TEST(Pt2HigherOrder, AnAutocastRegionWithoutAnyTraceHasNoLine) {
  json body = {{"nodes", json::array()}};
  json node = {{"target", "torch.ops.higher_order.wrap_with_autocast"},
               {"inputs", json::array({json{{"arg", {{"as_string", "cpu"}}}}, json{{"arg", {{"as_none", ""}}}},
                                       json{{"arg", {{"as_bool", true}}}}, json{{"arg", {{"as_none", ""}}}},
                                       json{{"arg", {{"as_graph", {{"graph", body}}}}}}})}};
  EXPECT_EQ(describePt2Region(node, Pt2RegionKind::kAutocast, "block"), "a torch.autocast region of block");
}

TEST(Pt2HigherOrder, AnUnsupportedOpIsRefusedWithItsFix) {
  json flex = {{"target", "torch.ops.higher_order.flex_attention"}, {"metadata", withTrace("attn.py", 12)}};
  EXPECT_EQ(unsupportedHigherOrderMessage(flex, "node 'fa' (torch.ops.higher_order.flex_attention)"),
            "node 'fa' (torch.ops.higher_order.flex_attention) at attn.py:12: the higher-order op 'flex_attention' is "
            "not supported (cond, while_loop, wrap_with_set_grad_enabled and wrap_with_autocast are); export the "
            "model with attn_implementation=\"sdpa\" (or \"eager\") in its config");
  json scan = {{"target", "torch.ops.higher_order.scan"}};
  EXPECT_EQ(unsupportedHigherOrderMessage(scan, "node 's'"),
            "node 's': the higher-order op 'scan' is not supported (cond, while_loop, wrap_with_set_grad_enabled and "
            "wrap_with_autocast are); rewrite that part of forward without it, or keep it out of the exported model");
}

}  // namespace
}  // namespace pipeforge::frontend
