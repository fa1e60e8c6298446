// After K steps, a pipelined run exported back into the original model holds
// the parameters single-process training of that model reaches (same data,
// optimizer, learning rates and loss scaling), up to rtol 1e-5 / atol 4e-5.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <iostream>

#include "tests/support/build_paths.h"
#include "tests/support/zoo.h"
#include "tests/train/train_fixture.h"

namespace pipeforge::testing {
namespace {

struct Case {
  const char* name;
  int nproc;
  RunSpec spec;
};

// The case's name, not its bytes, in test listings.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class Equivalence : public ::testing::TestWithParam<Case> {};

TEST_P(Equivalence, PipelinedEqualsSingleProcess) {
  const Case& c = GetParam();
  TrainWorkspace ws;
  const std::string config = ws.writeConfig(c.name, c.spec);
  auto run = runPipeforge(fmt::format("train --config '{}' --nproc {}", config, c.nproc));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  auto trained = exportedParameters(ws.checkpointDir(c.name), zooModelPath(c.spec.model), ws.dir() + "/trained.pt");
  auto expected = trainReference(train::loadTrainConfig(config));
  auto initial = torch::jit::load(zooModelPath(c.spec.model));
  int moved = 0;
  for (const auto& p : initial.named_parameters()) moved += !at::equal(p.value, trained.at(p.name));
  EXPECT_GT(moved, 0) << "training changed nothing";
  double worst = 0.0;
  for (const auto& [name, want] : expected) {
    if (trained.count(name)) worst = std::max(worst, (trained.at(name) - want).abs().max().item<double>());
  }
  RecordProperty("max_abs_diff", fmt::format("{:.3g}", worst));
  std::cout << fmt::format("[ {} ] largest difference from single-process training: {:.3g}\n", c.name, worst);
  auto bad = mismatches(trained, expected, 1e-5, 4e-5);
  EXPECT_TRUE(bad.empty()) << fmt::format("{}", fmt::join(bad, "\n")) << "\n" << run.output;
}

const char* kGpt2Stages = "num_stages: 2\n  policy: parameters";
const char* kGpt4Stages = "split_points: {blocks.0: BEGINNING, blocks.1: BEGINNING, ln_f: BEGINNING}";
const char* kMlp8Stages =
    "split_points: {blocks.0: BEGINNING, blocks.1: BEGINNING, blocks.2: BEGINNING, blocks.3: BEGINNING, "
    "blocks.4: BEGINNING, blocks.5: BEGINNING, out: BEGINNING}";

// Adam's eps is 1e-6, not 1e-8: the attention key bias has an analytically
// zero gradient (softmax ignores a constant added to every score of a
// query), so in float it is rounding noise of ~1e-9, which Adam with eps
// 1e-8 turns into full-size steps of random sign in both runs. eps 1e-6
// keeps that noise under the tolerance; real gradients (>> 1e-6) are unaffected.
const char* kAdamW = "{name: adamw, lr: 1.0e-3, weight_decay: 0.01, eps: 1.0e-6}";

RunSpec spec(std::string model, std::string split, std::string schedule, int stages_per_rank, int dp,
             std::string optimizer);

// Megatron's docstring example, PP2 N3M5 VP2: MegatronInterleaved with
// pipeline.microbatch_group_size 3, 5 microbatches of 2 rows.
RunSpec megatronGroups() {
  RunSpec s = spec("gpt", kGpt4Stages, "MegatronInterleaved", 2, 1, kAdamW);
  s.microbatches = 5;
  s.batch = 10;
  s.pipeline = ", microbatch_group_size: 3";
  return s;
}

RunSpec spec(std::string model, std::string split, std::string schedule, int stages_per_rank, int dp,
             std::string optimizer) {
  RunSpec s;
  s.model = std::move(model);
  s.split = std::move(split);
  s.schedule = std::move(schedule);
  s.stages_per_rank = stages_per_rank;
  s.data_parallel = dp;
  s.microbatches = dp == 2 ? 2 : 4;
  s.optimizer = std::move(optimizer);
  return s;
}

INSTANTIATE_TEST_SUITE_P(
    Train, Equivalence,
    ::testing::Values(
        // Tied wte/lm_head on different ranks.
        Case{"gpt_1f1b_2ranks", 2, spec("gpt", kGpt2Stages, "1F1B", 1, 1, kAdamW)},
        Case{"gpt_1f1b_4ranks", 4, spec("gpt", kGpt4Stages, "1F1B", 1, 1, "{name: sgd, lr: 0.05, momentum: 0.9}")},
        // V layout: the first and last stage (tied) share rank 0.
        Case{"gpt_zbv_2ranks", 2, spec("gpt", kGpt4Stages, "ZBVZeroBubble", 2, 1, "{name: adam, lr: 1.0e-3, eps: 1.0e-6}")},
        Case{"mlp_zbv_4ranks", 4, spec("mlp", kMlp8Stages, "ZBVZeroBubble", 2, 1,
                                       "{name: sgd, lr: 0.05, momentum: 0.9, nesterov: true}")},
        Case{"gpt_pp2_dp2", 4, spec("gpt", kGpt2Stages, "1F1B", 1, 2, kAdamW)},
        Case{"gpt_megatron_groups_of_3", 2, megatronGroups()}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });


// Note [PT2 stage files]: a `.pt2` model trains through its stage_<i>.pt2
// files (loaded by the runtime through the importer) to the parameters that
// single-process training of the model reaches.
TEST(Pt2Equivalence, PipelinedPt2StagesEqualSingleProcess) {
  const std::string model = std::string(PIPEFORGE_BINARY_DIR) + "/zoo_pt2/gpt_dynamic.pt2";  // microbatches of 2: a dynamic batch
  if (!std::filesystem::exists(model)) GTEST_SKIP() << "no PT2 zoo (its torch is older than 2.9): " << model;
  TrainWorkspace ws;
  RunSpec s = spec("gpt", "split_points: {blocks.0.mlp: BEGINNING, blocks.1: BEGINNING}", "1F1B", 1, 1, kAdamW);
  s.model_path = model;
  const std::string config = ws.writeConfig("pt2", s);
  auto run = runPipeforge(fmt::format("train --config '{}' --nproc 3", config));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  auto trained = exportedParameters(ws.checkpointDir("pt2"), model, ws.dir() + "/trained.pt");
  auto expected = trainReference(train::loadTrainConfig(config));
  auto bad = mismatches(trained, expected, 1e-5, 4e-5);
  EXPECT_TRUE(bad.empty()) << fmt::format("{}", fmt::join(bad, "\n")) << "\n" << run.output;
}

}  // namespace
}  // namespace pipeforge::testing
