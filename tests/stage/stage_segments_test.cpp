// cutAtCalls on the zoo GPT, whose forward calls wte, wpe, drop, blocks.0,
// blocks.1, ln_f and lm_head (Note [Checkpointing every k-th call]).
#include "stage/stage_segments.h"

#include <gtest/gtest.h>
#include <torch/script.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "tests/support/zoo.h"

namespace pipeforge::stage {
namespace {

using Names = std::vector<std::string>;

// "a, b" -> {"a", "b"}; "(no calls)" -> {}.
Names callsIn(const std::string& calls) {
  Names out;
  if (calls == "(no calls)") return out;
  std::size_t start = 0;
  while (true) {
    std::size_t comma = calls.find(", ", start);
    out.push_back(calls.substr(start, comma - start));
    if (comma == std::string::npos) return out;
    start = comma + 2;
  }
}

TEST(StageSegmentsTest, EveryKthCallIsASegmentOfItsOwn) {
  const torch::jit::Module gpt = torch::jit::load(testing::zooModelPath("gpt_dropout"));
  const std::map<int, Names> expected{
      {1, {"wte", "wpe", "drop", "blocks.0", "blocks.1", "ln_f", "lm_head"}},
      {2, {"wpe", "blocks.0", "ln_f"}},
      {3, {"drop", "ln_f"}},
  };
  for (const auto& [k, checkpointed_calls] : expected) {
    std::vector<torch::jit::Module> segments;
    const StageSegments cut = cutAtCalls(gpt, k, segments);
    ASSERT_EQ(segments.size(), cut.dataflow.stages.size()) << k;
    ASSERT_EQ(cut.checkpointed.size(), segments.size()) << k;
    ASSERT_EQ(cut.calls.size(), segments.size()) << k;
    Names chosen, all;
    for (std::size_t j = 0; j < segments.size(); ++j) {
      const Names calls = callsIn(cut.calls[j]);
      if (cut.checkpointed[j]) {
        ASSERT_EQ(calls.size(), 1u) << k << ": a checkpointed segment is one call alone";
        chosen.push_back(calls[0]);
      }
      all.insert(all.end(), calls.begin(), calls.end());
    }
    EXPECT_EQ(chosen, checkpointed_calls) << k;
    EXPECT_EQ(all, expected.at(1)) << k << ": the segments cover every call once, in order";
  }
}

TEST(StageSegmentsTest, SegmentsHoldTheStagesOwnTensors) {
  const torch::jit::Module gpt = torch::jit::load(testing::zooModelPath("gpt_dropout"));
  std::set<const c10::TensorImpl*> own;
  for (const auto& p : gpt.named_parameters(true)) own.insert(p.value.unsafeGetTensorImpl());
  std::vector<torch::jit::Module> segments;
  cutAtCalls(gpt, 2, segments);
  std::set<const c10::TensorImpl*> held;
  for (const torch::jit::Module& segment : segments) {
    for (const auto& p : segment.named_parameters(true)) held.insert(p.value.unsafeGetTensorImpl());
  }
  EXPECT_EQ(held, own);  // the very tensors, each in some segment
}

TEST(StageSegmentsTest, FewerCallsThanKGiveNoSegments) {
  const torch::jit::Module gpt = torch::jit::load(testing::zooModelPath("gpt_dropout"));
  std::vector<torch::jit::Module> segments;
  const StageSegments cut = cutAtCalls(gpt, 8, segments);
  EXPECT_TRUE(segments.empty());
  EXPECT_TRUE(cut.checkpointed.empty());
  EXPECT_TRUE(cut.calls.empty());
  EXPECT_TRUE(cut.dataflow.stages.empty());
}

}  // namespace
}  // namespace pipeforge::stage
