// Rank 0's banner, metrics.jsonl events, progress lines and summary, word
// for word (train/run_report.h).
#include "train/run_report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace pipeforge::train {
namespace {

namespace fs = std::filesystem;

// An empty output.dir for one test, removed after it.
class RunReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("pipeforge_run_report_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    config_.output_dir = (dir_ / "out").string();
    config_.steps = 10;
    config_.global_batch_size = 8;
    config_.pipeline.microbatches = 4;
    config_.data.format = DataFormat::kTokens;
    config_.data.block_size = 16;
    options_.out = &out_;
  }
  void TearDown() override { fs::remove_all(dir_); }

  RunStart freshStart() const {
    RunStart start;
    start.end = 10;
    start.world_size = 2;
    start.num_stages = 2;
    start.data = "tokens.bin: 1000 tokens";
    return start;
  }

  std::vector<nlohmann::json> metrics() const {
    std::ifstream in(fs::path(config_.output_dir) / "metrics.jsonl");
    std::vector<nlohmann::json> records;
    for (std::string line; std::getline(in, line);) records.push_back(nlohmann::json::parse(line));
    return records;
  }

  fs::path dir_;
  TrainConfig config_;
  TrainerOptions options_;
  std::ostringstream out_;
};

TEST_F(RunReportTest, BannerAndStartEventOfAFreshFp16Run) {
  config_.precision = PrecisionName::kFp16;
  config_.loss_scale = LossScaleConfig{1024.0, 2};
  LossScaler scaler(config_.loss_scale);
  RunStart start = freshStart();
  start.scaler = &scaler;
  RunReport report(config_, options_, start);
  EXPECT_EQ(out_.str(),
            "pipeforge train: 2 ranks = 2 pipeline x 1 data-parallel, 2 stages, schedule 1F1B, 4 microbatches, 10 "
            "steps of 8 rows\n"
            "  data: tokens.bin: 1000 tokens\n"
            "  precision: fp16 autocast, loss scale 1024 (x2 every 2 steps without overflow)\n");
  const nlohmann::json expected = {{"event", "start"},   {"step", 0},           {"world_size", 2},
                                   {"schedule", "1F1B"}, {"precision", "fp16"}, {"resumed_from", ""}};
  EXPECT_EQ(metrics(), std::vector<nlohmann::json>{expected});
}

TEST_F(RunReportTest, ResumeAtTheStopAfterStepSaysThereIsNothingToTrain) {
  options_.stop_after = 4;
  config_.pipeline.activation_checkpointing = ActivationCheckpointing::kEveryN;
  config_.pipeline.checkpoint_every_n = 2;
  RunStart start = freshStart();
  start.first_step = 4;
  start.end = 4;
  start.recomputed_calls = {"stage 0: blocks.0", "stage 1: blocks.2"};
  start.resumed_from = "ck/step_00000004";
  RunReport report(config_, options_, start);
  EXPECT_EQ(out_.str(),
            "pipeforge train: 2 ranks = 2 pipeline x 1 data-parallel, 2 stages, schedule 1F1B, 4 microbatches, 10 "
            "steps of 8 rows\n"
            "  data: tokens.bin: 1000 tokens\n"
            "  activation checkpointing every 2 calls: stage 0: blocks.0; stage 1: blocks.2 (this rank's stages)\n"
            "  resumed from ck/step_00000004 at step 4\n"
            "  nothing to train: the checkpoint is at step 4 and the run stops at 4 (--stop-after 4 is an absolute "
            "step; give one above 4)\n");
  ASSERT_EQ(metrics().size(), 1u);
  EXPECT_EQ(metrics()[0]["resumed_from"], "ck/step_00000004");
  EXPECT_EQ(metrics()[0]["step"], 4);
}

TEST_F(RunReportTest, ResumeAtTheLastStepNamesTrainingSteps) {
  RunStart start = freshStart();
  start.first_step = 10;
  start.resumed_from = "ck/step_00000010";
  RunReport report(config_, options_, start);
  EXPECT_NE(out_.str().find("  nothing to train: the checkpoint is at step 10 and the run stops at 10 (raise "
                            "training.steps, or set checkpoint.resume: false to start over)\n"),
            std::string::npos)
      << out_.str();
}

TEST_F(RunReportTest, EventsWriteOneRecordAndOneLineEach) {
  RunReport report(config_, options_, freshStart());
  out_.str("");
  report.trained(TrainRecord{3, 2.5, 1e-3, 0.5, 7.0, 0.5, std::nullopt});
  report.evaluated(5, 2.25);
  TrainConfig fp16 = config_;
  fp16.precision = PrecisionName::kFp16;
  fp16.loss_scale = LossScaleConfig{1024.0, 2};
  StepOutcomePolicy overflow_policy(fp16, {{"w"}});
  ASSERT_EQ(overflow_policy.decide(NonFinite{0, false}), StepOutcome::kOverflow);
  report.overflowed(6, 1024.0, NonFinite{0, false}, overflow_policy);
  TrainConfig skip = config_;
  skip.on_nonfinite = NonFinitePolicy::kSkipStep;
  StepOutcomePolicy skip_policy(skip, {{"w"}});
  ASSERT_EQ(skip_policy.decide(NonFinite{-1, true}), StepOutcome::kSkipped);
  report.skipped(7, NonFinite{-1, true}, skip_policy);
  report.checkpointed(8, "ck/step_00000008");
  EXPECT_EQ(out_.str(),
            "step  3/10  loss 2.5000  lr 1.00e-03  gnorm 0.5  256 tok/s  ETA 0:07\n"
            "step 5: held-out loss 2.2500 (1 batches)\n"
            "step 6: gradients overflowed at loss scale 1024: update skipped, scale now 512 (1 so far)\n"
            "step 7: update skipped: the loss is not finite (NaN or inf) (1 skipped so far)\n"
            "step 8: checkpoint ck/step_00000008\n");
  const std::vector<nlohmann::json> expected = {
      {{"event", "train"}, {"step", 3}, {"loss", 2.5}, {"lr", 1e-3}, {"grad_norm", 0.5}, {"step_s", 0.5},
       {"tokens_per_s", 256.0}},
      {{"event", "eval"}, {"step", 5}, {"loss", 2.25}},
      {{"event", "overflow"}, {"step", 6}, {"loss_scale", 1024.0}, {"next_loss_scale", 512.0}, {"first_stage", 0},
       {"overflow_steps", 1}},
      {{"event", "skipped_step"}, {"step", 7}, {"first_stage", -1}, {"loss_finite", false}, {"skipped_steps", 1}},
      {{"event", "checkpoint"}, {"step", 8}, {"dir", "ck/step_00000008"}},
  };
  const std::vector<nlohmann::json> all = metrics();
  ASSERT_EQ(all.size(), 6u);
  EXPECT_EQ(std::vector<nlohmann::json>(all.begin() + 1, all.end()), expected);
}

TEST_F(RunReportTest, TensorDataCountsRowsAndFp16RecordsTheScale) {
  config_.data.format = DataFormat::kTensors;
  RunReport report(config_, options_, freshStart());
  out_.str("");
  report.trained(TrainRecord{10, 1.0, 0.5, 2.0, 0.0, 3.25, 2048.0});
  EXPECT_EQ(out_.str(), "step 10/10  loss 1.0000  lr 5.00e-01  gnorm 3.25  4 rows/s  ETA 0:00\n");
  const nlohmann::json expected = {{"event", "train"}, {"step", 10},    {"loss", 1.0},        {"lr", 0.5},
                                   {"grad_norm", 3.25}, {"step_s", 2.0}, {"rows_per_s", 4.0}, {"loss_scale", 2048.0}};
  EXPECT_EQ(metrics().back(), expected);
}

TEST_F(RunReportTest, SummaryNamesLossesDroppedUpdatesAndWhereEverythingIs) {
  config_.checkpoint.dir = "ck";
  RunReport report(config_, options_, freshStart());
  out_.str("");
  TrainSummary summary;
  summary.last_step = 10;
  summary.seconds = 1.5;
  summary.first_loss = 3.0;
  summary.last_loss = 2.0;
  summary.last_eval_loss = 2.25;
  summary.skipped_steps = 1;
  summary.overflow_steps = 2;
  summary.checkpoint = "ck/step_00000010";
  LossScaler scaler(LossScaleConfig{256.0, 2});
  report.finish(summary, &scaler, "model.pt2", "out/trace.json");
  EXPECT_EQ(out_.str(),
            "trained steps 0..10 in 1.5 s: loss 3.0000 -> 2.0000, held-out loss 2.2500, 1 updates skipped "
            "(non-finite), 2 updates skipped (fp16 overflow; loss scale now 256)\n"
            "  checkpoint: ck/step_00000010\n"
            "  export:     pipeforge export ck --model model.pt2 --out trained.pt2\n"
            "  metrics:    " +
                (fs::path(config_.output_dir) / "metrics.jsonl").string() +
                "\n"
                "  trace:      out/trace.json  (open in https://ui.perfetto.dev)\n");
}

TEST_F(RunReportTest, SummaryWithoutLossesOrCheckpointNamesTheMetrics) {
  RunReport report(config_, options_, freshStart());
  out_.str("");
  report.finish(TrainSummary{}, nullptr, "model.pt", "");
  EXPECT_EQ(out_.str(), "  metrics:    " + (fs::path(config_.output_dir) / "metrics.jsonl").string() + "\n");
}

}  // namespace
}  // namespace pipeforge::train
