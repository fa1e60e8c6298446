// Note [Deferred reports]: rank 0 reports a logged step or an evaluation
// only when drained, with the mean of the losses its replicas published.
#include "train/deferred_reports.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>

namespace pipeforge::train {
namespace {

namespace fs = std::filesystem;

class DeferredReportsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("pipeforge_deferred_reports_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    config_.output_dir = dir_.string();
    config_.steps = 4;
    config_.global_batch_size = 2;
    config_.data.format = DataFormat::kTensors;
    config_.pipeline.data_parallel = 2;
    config_.eval_batches = 2;
    options_.out = &out_;
    RunStart start;
    start.end = 4;
    start.world_size = 2;
    report_.emplace(config_, options_, start);
    out_.str("");
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  TrainConfig config_;
  TrainerOptions options_;
  std::ostringstream out_;
  std::optional<RunReport> report_;
  RankChannel channel_{runtime::DistEnv{}, std::chrono::milliseconds(1000)};  // one process: in memory
};

TEST(DeferredReportKeys, NameTheStepAndTheBatch) {
  EXPECT_EQ(lossKey(12), "loss/12");
  EXPECT_EQ(evalKey(12, 3), "eval/12/3");
}

TEST_F(DeferredReportsTest, NothingIsReportedBeforeTheDrain) {
  DeferredReports reports(config_, channel_, &*report_);
  reports.add(PendingReport{false, 1, 0.5, 1.0, 3.0, 0.25, std::nullopt});
  EXPECT_EQ(reports.size(), 1u);
  EXPECT_EQ(out_.str(), "");
}

TEST_F(DeferredReportsTest, DrainReportsTheFirstEntriesWithTheReplicaMean) {
  DeferredReports reports(config_, channel_, &*report_);
  channel_.publish("loss/1/0", "2");
  channel_.publish("loss/1/1", "3");
  reports.add(PendingReport{false, 1, 0.5, 1.0, 3.0, 0.25, std::nullopt});
  channel_.publish("eval/2/0/0", "1");
  channel_.publish("eval/2/0/1", "2");
  channel_.publish("eval/2/1/0", "3");
  channel_.publish("eval/2/1/1", "4");
  reports.add(PendingReport{true, 2, 0.0, 0.0, 0.0, 0.0, std::nullopt});
  reports.add(PendingReport{false, 3, 0.5, 1.0, 1.0, 0.25, std::nullopt});
  TrainSummary summary;
  reports.drain(2, summary);
  EXPECT_EQ(reports.size(), 1u);
  EXPECT_EQ(out_.str(),
            "step 1/4  loss 2.5000  lr 5.00e-01  gnorm 0.25  2 rows/s  ETA 0:03\n"
            "step 2: held-out loss 2.5000 (2 batches)\n");
  EXPECT_EQ(summary.first_loss, 2.5);
  EXPECT_EQ(summary.last_loss, 2.5);
  EXPECT_EQ(summary.last_eval_loss, 2.5);

  channel_.publish("loss/3/0", "1");
  channel_.publish("loss/3/1", "0.5");
  reports.drain(reports.size(), summary);
  EXPECT_EQ(reports.size(), 0u);
  EXPECT_EQ(summary.first_loss, 2.5);
  EXPECT_EQ(summary.last_loss, 0.75);
}

TEST_F(DeferredReportsTest, OtherRanksForgetWithoutTakingLosses) {
  DeferredReports reports(config_, channel_, nullptr);
  reports.add(PendingReport{false, 1, 0.5, 1.0, 3.0, 0.25, std::nullopt});
  reports.add(PendingReport{true, 1, 0.0, 0.0, 0.0, 0.0, std::nullopt});
  TrainSummary summary;
  reports.drain(1, summary);
  EXPECT_EQ(reports.size(), 0u);
  EXPECT_FALSE(summary.first_loss.has_value());
  EXPECT_FALSE(summary.last_eval_loss.has_value());
}

}  // namespace
}  // namespace pipeforge::train
