// training.trace across ranks (train/trace_gathering.h): what rank 0 writes
// from every rank's published steps, and what a malformed one costs.
#include "train/trace_gathering.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace pipeforge::train {
namespace {

namespace fs = std::filesystem;

RankStepProfile oneStep(int rank, const std::string& action) {
  RankStepProfile p;
  p.rank = rank;
  p.step = 3;
  p.begin_unix_s = 1000.0;
  p.step_s = 0.5;
  p.profile.steps.push_back(runtime::TimedStep{schedules::parseAction(action), 0.0, 0.25, 0.0});
  p.profile.step_s = 0.5;
  return p;
}

class TraceGatheringTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = fs::temp_directory_path() /
            ("pipeforge_trace_gathering_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".json");
    fs::remove(path_);
  }
  void TearDown() override { fs::remove(path_); }

  std::string written() const {
    std::ifstream in(path_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  fs::path path_;
  RankChannel channel_{runtime::DistEnv{}, std::chrono::milliseconds(1000)};  // one process: in memory
};

TEST_F(TraceGatheringTest, RankZeroWritesEveryRanksSteps) {
  TraceGathering rank1(channel_, 1, 2);
  rank1.add(oneStep(1, "1F0"));
  rank1.publish();
  TraceGathering rank0(channel_, 0, 2);
  rank0.add(oneStep(0, "0F0"));
  rank0.publish();
  ASSERT_TRUE(rank0.write(path_.string()));
  EXPECT_EQ(written(), measuredTraceText({oneStep(0, "0F0"), oneStep(1, "1F0")}, 2));
}

TEST_F(TraceGatheringTest, ARankWithoutTracedStepsPublishesAnEmptyList) {
  TraceGathering rank0(channel_, 0, 1);
  rank0.publish();
  EXPECT_EQ(channel_.take("trace/0"), "[]");
}

TEST_F(TraceGatheringTest, AMalformedProfileCostsTheTraceNotTheRun) {
  TraceGathering rank0(channel_, 0, 2);
  rank0.add(oneStep(0, "0F0"));
  rank0.publish();
  channel_.publish("trace/1", "[{\"rank\": ");
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(rank0.write(path_.string()));
  const std::string warning = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(warning.rfind("warning: no trace written: the store key 'trace/1' holds a malformed profile (", 0), 0u)
      << warning;
  EXPECT_FALSE(fs::exists(path_));
}

}  // namespace
}  // namespace pipeforge::train
