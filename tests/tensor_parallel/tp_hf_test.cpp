// Tensor parallel planned from the graph (issue 44), on the transformers
// zoo: the plan the planner finds equals transformers' own
// base_model_tp_plan, each rank's rewritten model (every rank of the group
// in a thread, FakeWorld collectives) gives the whole model's outputs and
// gradients, and what cannot be split exactly is refused, naming why.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <torch/script.h>

#include <fnmatch.h>

#include <fstream>

#include "frontend/pt2_import.h"
#include "tensor_parallel/tp_plan.h"
#include "tests/support/build_paths.h"
#include "tests/tensor_parallel/tp_ranks.h"

namespace pipeforge::tensor_parallel {
namespace {

std::string zooHf(const std::string& name) { return std::string(PIPEFORGE_BINARY_DIR) + "/zoo_hf/" + name; }

nlohmann::json meta(const std::string& family) {
  std::ifstream in(zooHf(family + ".json"));
  return nlohmann::json::parse(in);
}

torch::jit::Module load(const std::string& family) { return frontend::loadPt2Model(zooHf(family + ".pt2")); }

std::vector<at::Tensor> tokens(const std::string& family, int batch = 2, int seq = 8) {
  at::manual_seed(7);
  return {at::randint(meta(family)["vocab"].get<int64_t>(), {batch, seq}, at::kLong)};
}

// transformers' plan for `family` expanded over the model's layers, linears only.
std::map<std::string, std::string> expectedStyles(const std::string& family, const TpPlan& plan) {
  std::map<std::string, std::string> out;
  const nlohmann::json plan_json = meta(family)["tp_plan"];
  for (const auto& [glob, style] : plan_json.items()) {
    const std::string pattern = "model." + glob;
    for (const auto& l : plan.linears) {
      if (fnmatch(pattern.c_str(), l.module.c_str(), 0) == 0) out[l.module] = style.get<std::string>();
    }
  }
  return out;
}

class FamilyPlan : public ::testing::TestWithParam<std::string> {};

TEST_P(FamilyPlan, IsTransformersOwnPlan) {
  const std::string family = GetParam();
  torch::jit::Module model = load(family);
  TpPlan plan = planTensorParallel(model, tokens(family), 2);
  EXPECT_EQ(plan.styles(), expectedStyles(family, plan)) << plan.describe();
  EXPECT_EQ(plan.styles().size(), 7u * meta(family)["config"]["num_hidden_layers"].get<std::size_t>());
  // lm_head's logits leave the stage: it runs whole, and the plan says why.
  auto head = std::find_if(plan.linears.begin(), plan.linears.end(), [](const auto& l) { return l.module == "lm_head"; });
  ASSERT_NE(head, plan.linears.end());
  EXPECT_EQ(head->split, LinearSplit::kWhole);
  EXPECT_NE(head->why.find("leaves the stage"), std::string::npos) << head->why;
  EXPECT_EQ(plan.reduces, 2 * meta(family)["config"]["num_hidden_layers"].get<int>());
}

TEST_P(FamilyPlan, RanksComputeTheWholeModel) {
  const std::string family = GetParam();
  int split = testing::compareWithWhole([&] { return load(family); }, tokens(family), 2);
  // 7 linears a layer, q/k/v and gate/up with no bias here but Qwen2's q/k/v.
  EXPECT_GE(split, 7 * meta(family)["config"]["num_hidden_layers"].get<int>());
}

INSTANTIATE_TEST_SUITE_P(Zoo, FamilyPlan, ::testing::Values("llama", "qwen2", "mistral", "gemma"));

std::string refusal(const std::string& family, int degree) {
  try {
    planTensorParallel(load(family), tokens(family), degree);
  } catch (const TpPlanError& e) {
    return e.what();
  }
  return "(planned without an error)";
}

TEST(TpRefusal, KeyValueHeadsTheDegreeDoesNotDivide) {
  // 4 attention heads, 2 key/value heads: 4 ranks cannot share the 2.
  std::string message = refusal("llama", 4);
  EXPECT_NE(message.find("model.layers.0.self_attn (modeling_llama.py:"), std::string::npos) << message;
  EXPECT_NE(message.find("tensor_parallel 4"), std::string::npos) << message;
  EXPECT_NE(message.find("num_key_value_heads"), std::string::npos) << message;
}

TEST(TpRefusal, NormAcrossAllHeads) {
  // OLMo2 normalizes q and k over num_heads * head_dim, before the head view.
  std::string message = refusal("olmo2", 2);
  EXPECT_NE(message.find("model.layers.0.self_attn.q_norm (modeling_olmo2.py:"), std::string::npos) << message;
  EXPECT_NE(message.find("reduces over the split dimension"), std::string::npos) << message;
}

TEST(TpRefusal, FusedProjection) {
  // Phi3's qkv_proj computes q, k and v at once and slices them apart.
  std::string message = refusal("phi3", 2);
  EXPECT_NE(message.find("model.layers.0.self_attn (modeling_phi3.py:"), std::string::npos) << message;
  EXPECT_NE(message.find("fused"), std::string::npos) << message;
}

}  // namespace
}  // namespace pipeforge::tensor_parallel
