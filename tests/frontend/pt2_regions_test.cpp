// PT2 region grouping: graph JSON in, the module calls each run of nodes
// becomes and what each call takes and returns out.
#include "frontend/pt2_regions.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "frontend/errors.h"

namespace pipeforge::frontend {
namespace {

using json = nlohmann::ordered_json;
using Strings = std::vector<std::string>;

// A node that reads the tensors `uses` and makes the tensor `name`, run
// inside `stack` (an nn_module_stack string; "" when the node carries none).
json node(const std::string& name, const std::string& target, const Strings& uses, const std::string& stack) {
  json inputs = json::array();
  for (const auto& u : uses) inputs.push_back({{"name", "self"}, {"arg", {{"as_tensor", {{"name", u}}}}}});
  json n = {{"name", name},
            {"target", target},
            {"inputs", inputs},
            {"outputs", json::array({{{"as_tensor", {{"name", name}}}}})}};
  if (!stack.empty()) n["metadata"] = {{"nn_module_stack", stack}};
  return n;
}

json graphOf(const std::vector<json>& nodes) { return {{"nodes", nodes}, {"tensor_values", json::object()}}; }

std::vector<std::pair<bool, int>> itemsOf(const Pt2Region& region) {
  std::vector<std::pair<bool, int>> items;
  for (const auto& item : region.items) items.emplace_back(item.is_region, item.index);
  return items;
}

Pt2Regions group(const json& graph, const Pt2GraphValues& values) {
  return groupPt2Regions(graph, pt2GraphNodes(graph), values);
}

constexpr const char* kRoot = "L__self__,,m.Net";
constexpr const char* kBlock = "L__self___blocks_0,blocks.0,m.Block";

TEST(Pt2RegionGrouping, NestedCallsFromJsonText) {
  json graph = json::parse(R"({
    "nodes": [
      {"name": "linear", "target": "torch.ops.aten.linear.default",
       "inputs": [{"name": "input", "arg": {"as_tensor": {"name": "x"}}},
                  {"name": "weight", "arg": {"as_tensor": {"name": "p_blocks_0_fc_weight"}}}],
       "outputs": [{"as_tensor": {"name": "linear"}}],
       "metadata": {"nn_module_stack": "L__self__,,m.Net;L__self___blocks_0,blocks.0,m.Block;L__self___blocks_0_fc,blocks.0.fc,torch.nn.Linear"}},
      {"name": "relu", "target": "torch.ops.aten.relu.default",
       "inputs": [{"name": "self", "arg": {"as_tensor": {"name": "linear"}}}],
       "outputs": [{"as_tensor": {"name": "relu"}}],
       "metadata": {"nn_module_stack": "L__self__,,m.Net;L__self___blocks_0,blocks.0,m.Block"}},
      {"name": "mul", "target": "torch.ops.aten.mul.Tensor",
       "inputs": [{"name": "self", "arg": {"as_tensor": {"name": "relu"}}},
                  {"name": "other", "arg": {"as_tensor": {"name": "x"}}}],
       "outputs": [{"as_tensor": {"name": "mul"}}],
       "metadata": {"nn_module_stack": "L__self__,,m.Net"}}
    ]})");
  Pt2GraphValues values;
  values.placeholder_fqn = {{"p_blocks_0_fc_weight", "blocks.0.fc.weight"}};
  values.fqn_placeholder = {{"blocks.0.fc.weight", "p_blocks_0_fc_weight"}};
  values.user_outputs = {"mul"};

  Pt2Regions r = group(graph, values);

  ASSERT_EQ(r.regions.size(), 3u);
  const Pt2Region& root = r.regions[0];
  EXPECT_EQ(root.path, "");
  EXPECT_EQ(itemsOf(root), (std::vector<std::pair<bool, int>>{{true, 1}, {false, 2}}));
  EXPECT_EQ(root.first, 0);
  EXPECT_EQ(root.last, 2);

  const Pt2Region& block = r.regions[1];
  EXPECT_EQ(block.path, "blocks.0");
  EXPECT_EQ(block.key, "L__self___blocks_0|blocks.0");
  EXPECT_EQ(block.type, "m.Block");
  EXPECT_EQ(block.parent, 0);
  EXPECT_EQ(itemsOf(block), (std::vector<std::pair<bool, int>>{{true, 2}, {false, 1}}));
  EXPECT_EQ(block.first, 0);
  EXPECT_EQ(block.last, 1);
  EXPECT_EQ(block.inputs, Strings{"x"});  // the weight is read by GetAttr inside the call
  EXPECT_EQ(block.outputs, Strings{"relu"});

  const Pt2Region& fc = r.regions[2];
  EXPECT_EQ(fc.path, "blocks.0.fc");
  EXPECT_EQ(fc.type, "torch.nn.Linear");
  EXPECT_EQ(fc.parent, 1);
  EXPECT_EQ(itemsOf(fc), (std::vector<std::pair<bool, int>>{{false, 0}}));
  EXPECT_EQ(fc.inputs, Strings{"x"});
  EXPECT_EQ(fc.outputs, Strings{"linear"});

  EXPECT_EQ(r.region_of_pos, (std::vector<int>{2, 1, 0}));
  EXPECT_EQ(r.def_pos.at("linear"), 0);
  EXPECT_EQ(r.def_pos.at("mul"), 2);
  EXPECT_TRUE(r.writes.empty());
}

TEST(Pt2RegionGrouping, AParameterOutsideTheCallIsAnInputUnlessATiedAliasIsInside) {
  // The head reads the embedding's weight under its own tied name.
  json graph = graphOf({node("linear", "torch.ops.aten.linear.default", {"x", "p_wte_weight"},
                             "L__self___lm_head,lm_head,torch.nn.Linear"),
                        node("mul", "torch.ops.aten.mul.Tensor", {"x", "p_wte_weight"}, kBlock)});
  Pt2GraphValues values;
  values.placeholder_fqn = {{"p_wte_weight", "wte.weight"}};
  values.aliases = {{"wte.weight", {"wte.weight", "lm_head.weight"}}};
  values.user_outputs = {"linear", "mul"};
  Pt2Regions r = group(graph, values);
  ASSERT_EQ(r.regions.size(), 3u);
  EXPECT_EQ(r.regions[1].path, "lm_head");
  EXPECT_EQ(r.regions[1].inputs, Strings{"x"});
  EXPECT_EQ(r.regions[2].path, "blocks.0");
  EXPECT_EQ(r.regions[2].inputs, (Strings{"x", "p_wte_weight"}));
  EXPECT_EQ(reachableAlias(values, "wte.weight", "lm_head"), std::optional<std::string>("lm_head.weight"));
  EXPECT_EQ(reachableAlias(values, "wte.weight", ""), std::optional<std::string>("wte.weight"));
  EXPECT_EQ(reachableAlias(values, "wte.weight", "blocks.0"), std::nullopt);
}

TEST(Pt2RegionGrouping, RepeatedCallsOfOneModuleAreTwoRegions) {
  json graph = graphOf({node("a", "torch.ops.aten.relu.default", {"x"}, "L__self___act,act,m.Act"),
                        node("b", "torch.ops.aten.relu.default", {"a"}, "L__self___act@1,act,m.Act")});
  Pt2GraphValues values;
  values.user_outputs = {"b"};
  Pt2Regions r = group(graph, values);
  ASSERT_EQ(r.regions.size(), 3u);
  EXPECT_EQ(r.regions[1].key, "L__self___act|act");
  EXPECT_EQ(r.regions[2].key, "L__self___act@1|act");
  EXPECT_EQ(r.regions[1].outputs, Strings{"a"});
  EXPECT_EQ(r.regions[2].inputs, Strings{"a"});
  EXPECT_EQ(itemsOf(r.regions[0]), (std::vector<std::pair<bool, int>>{{true, 1}, {true, 2}}));
}

TEST(Pt2RegionGrouping, AModuleOutsideItsCallerIsFoldedIntoTheCaller) {
  // `shared` is not a submodule of blocks.0, so no attribute chain reaches it from there.
  json graph = graphOf({node("a", "torch.ops.aten.relu.default", {"x"},
                             std::string(kBlock) + ";L__self___shared,shared,m.Shared")});
  Pt2GraphValues values;
  values.user_outputs = {"a"};
  Pt2Regions r = group(graph, values);
  ASSERT_EQ(r.regions.size(), 2u);
  EXPECT_EQ(r.regions[1].path, "blocks.0");
  EXPECT_EQ(r.region_of_pos, std::vector<int>{1});
}

TEST(Pt2RegionGrouping, ANodeWithoutAStackStaysInTheOpenCall) {
  // Export passes add nodes with no module stack; forward's own nodes carry the root frame.
  json graph = graphOf({node("a", "torch.ops.aten.relu.default", {"x"}, kBlock),
                        node("b", "torch.ops.aten.relu.default", {"a"}, ""),
                        node("c", "torch.ops.aten.relu.default", {"b"}, kRoot)});
  Pt2GraphValues values;
  values.user_outputs = {"c"};
  Pt2Regions r = group(graph, values);
  ASSERT_EQ(r.regions.size(), 2u);
  EXPECT_EQ(r.region_of_pos, (std::vector<int>{1, 1, 0}));
  EXPECT_EQ(r.regions[1].outputs, Strings{"b"});
}

TEST(Pt2RegionGrouping, ABufferUpdateIsWrittenBackAfterTheLastReadOfTheOldValue) {
  json graph = graphOf({node("add", "torch.ops.aten.add.Tensor", {"b_count"}, "L__self___bn,bn,m.Norm"),
                        node("mul", "torch.ops.aten.mul.Tensor", {"x", "b_count"}, "L__self___bn,bn,m.Norm"),
                        node("out", "torch.ops.aten.relu.default", {"mul"}, kRoot)});
  Pt2GraphValues values;
  values.placeholder_fqn = {{"b_count", "bn.count"}};
  values.fqn_placeholder = {{"bn.count", "b_count"}};
  values.mutations = {{"add", "bn.count"}};
  values.user_outputs = {"out"};
  Pt2Regions r = group(graph, values);
  ASSERT_EQ(r.writes.size(), 1u);
  ASSERT_EQ(r.writes.at(1).size(), 1u);
  EXPECT_EQ(r.writes.at(1)[0].value, "add");
  EXPECT_EQ(r.writes.at(1)[0].buffer, "b_count");
  // Written back inside the call, so `add` is not returned from it.
  EXPECT_EQ(r.regions[1].inputs, Strings{"x"});
  EXPECT_EQ(r.regions[1].outputs, Strings{"mul"});
}

TEST(Pt2RegionGrouping, MutationErrorsNameTheValue) {
  json graph = graphOf({node("add", "torch.ops.aten.add.Tensor", {"x"}, "")});
  Pt2GraphValues values;
  values.fqn_placeholder = {{"bn.count", "b_count"}};
  values.mutations = {{"add", "bn.missing"}};
  try {
    group(graph, values);
    FAIL() << "expected a Pt2Error";
  } catch (const Pt2Error& e) {
    EXPECT_STREQ(e.what(), "a mutation output names 'bn.missing', which is not a graph input");
  }
  values.mutations = {{"nope", "bn.count"}};
  try {
    group(graph, values);
    FAIL() << "expected a Pt2Error";
  } catch (const Pt2Error& e) {
    EXPECT_STREQ(e.what(), "mutation output 'nope' is not computed by any node");
  }
}

// Note [Symbolic sizes are recomputed, not returned]: blocks.0 computes a
// size that blocks.1 reads; blocks.1 receives the tensor it is the size of.
TEST(Pt2RegionGrouping, ASymbolicSizeIsNotReturnedAndItsReaderGetsItsSource) {
  json size = {{"name", "sym_size_int"},
               {"target", "torch.ops.aten.sym_size.int"},
               {"inputs", json::array({{{"name", "self"}, {"arg", {{"as_tensor", {{"name", "x"}}}}}},
                                       {{"name", "dim"}, {"arg", {{"as_int", 0}}}}})},
               {"outputs", json::array({{{"as_sym_int", {{"as_name", "sym_size_int"}}}}})},
               {"metadata", {{"nn_module_stack", kBlock}}}};
  json view = node("view", "torch.ops.aten.view.default", {"x"}, kBlock);
  json view_size = {{"as_sym_ints", {{{"as_name", "sym_size_int"}}, {{"as_int", -1}}}}};
  view["inputs"].push_back({{"name", "size"}, {"arg", view_size}});
  json later = node("view_1", "torch.ops.aten.view.default", {"view"}, "L__self___blocks_1,blocks.1,m.Block");
  json later_size = {{"as_sym_ints", {{{"as_name", "sym_size_int"}}}}};
  later["inputs"].push_back({{"name", "size"}, {"arg", later_size}});
  json graph = graphOf({size, view, later});
  graph["sym_int_values"] = {{"sym_size_int", json::object()}};
  Pt2GraphValues values;
  values.user_outputs = {"view_1"};
  Pt2Regions r = group(graph, values);
  ASSERT_EQ(r.regions.size(), 3u);
  EXPECT_EQ(r.regions[1].path, "blocks.0");
  EXPECT_EQ(r.regions[1].inputs, Strings{"x"});
  EXPECT_EQ(r.regions[1].outputs, Strings{"view"});
  EXPECT_EQ(r.regions[2].path, "blocks.1");
  EXPECT_EQ(r.regions[2].inputs, (Strings{"view", "x"}));
  EXPECT_TRUE(isPt2FloatingSize(graph, r.def_pos, "sym_size_int"));
  EXPECT_FALSE(isPt2FloatingSize(graph, r.def_pos, "view"));
  EXPECT_FALSE(isPt2FloatingSize(graph, r.def_pos, "x"));  // made by no node
}

}  // namespace
}  // namespace pipeforge::frontend
