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

bool tiedEmbeddings(const std::string& family) {
  const nlohmann::json config = meta(family)["config"];
  return config.contains("tie_word_embeddings") && config["tie_word_embeddings"].get<bool>();
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
    // Embeddings below: transformers splits a tied one with its head, which auto keeps whole.
    if (style.get<std::string>().rfind("embedding", 0) == 0) continue;
    const std::string pattern = "*." + glob;  // under the base model: model., gpt_neox., ...
    for (const auto& l : plan.linears) {
      if (fnmatch(pattern.c_str(), l.module.c_str(), 0) == 0) out[l.module] = style.get<std::string>();
    }
  }
  // Beyond transformers' plans: Megatron's vocab-parallel embedding, for an
  // embedding whose weight nothing else reads (auto keeps a tied one whole).
  if (!tiedEmbeddings(family)) {
    out[family == "gpt_neox" ? "gpt_neox.embed_in" : "model.embed_tokens"] = "embedding_rowwise";
  }
  return out;
}

class FamilyPlan : public ::testing::TestWithParam<std::string> {};

TEST_P(FamilyPlan, IsTransformersOwnPlan) {
  const std::string family = GetParam();
  torch::jit::Module model = load(family);
  TpPlan plan = planTensorParallel(model, tokens(family), 2);
  const auto expected = expectedStyles(family, plan);
  EXPECT_EQ(plan.styles(), expected) << plan.describe();
  EXPECT_GE(expected.size(), 4u * meta(family)["config"]["num_hidden_layers"].get<std::size_t>());
  // The LM head's logits leave the stage: it runs whole, and the plan says
  // why; a tied embedding stays whole with it (Note [Tied vocabulary]).
  ASSERT_FALSE(plan.linears.empty());
  const PlannedLinear& head = plan.linears.back();
  const bool tied = tiedEmbeddings(family);
  EXPECT_EQ(head.split, LinearSplit::kWhole) << head.module;
  EXPECT_NE(head.why.find("leaves the stage"), std::string::npos) << head.why;
  if (tied) EXPECT_NE(plan.linears.front().why.find("tied"), std::string::npos) << plan.linears.front().why;
  EXPECT_EQ(plan.reduces, 2 * meta(family)["config"]["num_hidden_layers"].get<int>() + (tied ? 0 : 1));
}

TEST_P(FamilyPlan, RanksComputeTheWholeModel) {
  const std::string family = GetParam();
  int split = testing::compareWithWhole([&] { return load(family); }, tokens(family), 2);
  // At least 4 split linears a layer (GPT-NeoX's fused qkv, dense, and its MLP's two).
  EXPECT_GE(split, 4 * meta(family)["config"]["num_hidden_layers"].get<int>());
}

// Note [Sequence parallel]: norms and residual adds on each rank's part of
// the sequence, a gather before each column and a reduce-scatter after each row.
TEST_P(FamilyPlan, SequenceParallelRanksComputeTheWholeModel) {
  const std::string family = GetParam();
  TpOptions sp;
  sp.sequence_parallel = true;
  TpPlan plan = planTensorParallel(load(family), tokens(family), 2, sp);
  EXPECT_EQ(plan.styles(), planTensorParallel(load(family), tokens(family), 2).styles());
  // Every layer's attention and MLP gather their input along the sequence,
  // but those of the first layer that read the (whole) embedding: its
  // attention, and GPT-NeoX's parallel MLP too.
  EXPECT_GE(plan.sequence_gathers, 2 * meta(family)["config"]["num_hidden_layers"].get<int>() - 2) << plan.describe();
  EXPECT_EQ(plan.gathers, 1);  // the logits leave the stage split along the sequence
  testing::compareWithWhole([&] { return load(family); }, tokens(family), 2, sp);
}

// Loss parallel (Note [Vocab-parallel cross-entropy]): lm_head split by
// vocabulary, its logits left split, and the cross-entropy taken from the
// blocks equals the whole model's loss and gradients. A tied head and
// embedding split their one weight alike (Note [Tied vocabulary]): both
// read each rank's rows, and their gradients add on them.
TEST_P(FamilyPlan, LossParallelRanksComputeTheWholeLoss) {
  const std::string family = GetParam();
  at::manual_seed(9);
  at::Tensor targets = at::randint(meta(family)["vocab"].get<int64_t>(), {2, 8}, at::kLong);
  targets.index_put_({0, 0}, -1);  // ignored, as at::cross_entropy_loss's ignore_index
  for (bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "sequence parallel" : "tensor parallel");
    TpOptions options;
    options.sequence_parallel = sp;
    options.vocab_parallel_outputs = {0};
    TpPlan plan = planTensorParallel(load(family), tokens(family), 2, options);
    EXPECT_EQ(plan.vocab_split_outputs, std::vector<int>{0}) << plan.describe();
    EXPECT_EQ(plan.linears.back().split, LinearSplit::kColumn) << plan.describe();  // lm_head (embed_out)
    EXPECT_EQ(plan.linears.front().split, LinearSplit::kVocab) << plan.describe();  // the embedding
    EXPECT_EQ(plan.gathers, 0) << plan.describe();
    testing::compareWithWhole([&] { return load(family); }, tokens(family), 2, options, targets);
  }
}

// Qwen3 normalizes q and k per head with one weight every rank holds whole
// (its gradient is summed by f); GPT-NeoX lays its fused qkv out per head,
// so a split by heads cuts it exactly.
INSTANTIATE_TEST_SUITE_P(Zoo, FamilyPlan,
                         ::testing::Values("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gpt_neox"));

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

TEST(TpRefusal, MixtureOfExpertsRouter) {
  // Mixtral's router takes a softmax over all its experts' logits.
  std::string message = refusal("mixtral", 2);
  EXPECT_NE(message.find("model.layers.0.mlp.gate (modeling_mixtral.py:"), std::string::npos) << message;
  EXPECT_NE(message.find("router"), std::string::npos) << message;
}

TEST(TpRefusal, NothingToSplit) {
  // GPT-2's Conv1D is an addmm, not a linear: tensor parallel would change nothing.
  std::string message = refusal("gpt2", 2);
  EXPECT_NE(message.find("finds nothing to split"), std::string::npos) << message;
  EXPECT_NE(message.find("transformer.h.0.attn.c_attn (pytorch_utils.py:"), std::string::npos) << message;
}

TEST(TpRefusal, FusedProjection) {
  // Phi3's qkv_proj computes q, k and v at once and slices them apart.
  std::string message = refusal("phi3", 2);
  EXPECT_NE(message.find("model.layers.0.self_attn (modeling_phi3.py:"), std::string::npos) << message;
  EXPECT_NE(message.find("fused"), std::string::npos) << message;
}

// Note [Explicit plans]: torchtitan's plan by FQN glob instead of the graph's.
TEST(TpExplicitPlan, KeepsOlmo2AttentionWholeAndSplitsItsMlp) {
  // Auto refuses OLMo2 (q_norm over all heads); a plan naming only the MLP trains it.
  TpOptions styles;
  styles.styles = {{"layers.*.mlp.gate_proj", "colwise"}, {"layers.*.mlp.up_proj", "colwise"},
                   {"layers.*.mlp.down_proj", "rowwise"}};
  TpPlan plan = planTensorParallel(load("olmo2"), tokens("olmo2"), 2, styles);
  EXPECT_EQ(plan.styles().size(), 3u * meta("olmo2")["config"]["num_hidden_layers"].get<std::size_t>())
      << plan.describe();
  EXPECT_EQ(plan.styles().count("model.layers.0.self_attn.q_proj"), 0u);
  EXPECT_GE(testing::compareWithWhole([] { return load("olmo2"); }, tokens("olmo2"), 2, styles), 12);
}

TEST(TpExplicitPlan, ColwiseHeadGathersItsLogits) {
  // transformers' Llama plan plus lm_head colwise: the logits are computed
  // split by vocabulary and gathered whole where they leave the stage.
  TpOptions styles;
  for (const auto& [glob, style] : meta("llama")["tp_plan"].items()) {
    styles.styles.emplace_back(glob, style.get<std::string>());
  }
  styles.styles.emplace_back("lm_head", "colwise");
  TpPlan plan = planTensorParallel(load("llama"), tokens("llama"), 2, styles);
  EXPECT_EQ(plan.styles().at("lm_head"), "colwise");
  EXPECT_EQ(plan.gathers, 1);
  testing::compareWithWhole([] { return load("llama"); }, tokens("llama"), 2, styles);
}

TEST(TpExplicitPlan, APlanTheGraphContradictsIsRefused) {
  try {
    TpOptions rowwise;
    rowwise.styles = {{"*.o_proj", "rowwise"}};
    planTensorParallel(load("llama"), tokens("llama"), 2, rowwise);
    ADD_FAILURE() << "planned without an error";
  } catch (const TpPlanError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("does not fit the graph"), std::string::npos) << message;
    EXPECT_NE(message.find("model.layers.0.self_attn.o_proj (modeling_llama.py:"), std::string::npos) << message;
    EXPECT_NE(message.find("'*.o_proj': rowwise"), std::string::npos) << message;
    EXPECT_NE(message.find("arrives whole"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace pipeforge::tensor_parallel
