#include "schedules/validate.h"

#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/schedules/golden.h"

#include "schedules/csv.h"

namespace pipeforge::schedules {
namespace {

using testing::readGolden;

using ::testing::HasSubstr;

std::string errorOf(const Program& p) {
  try {
    validateProgram(p);
  } catch (const ScheduleError& e) {
    return e.what();
  }
  return "";
}

// PyTorch's TestValidateSchedule.test_valid_schedule.
TEST(ValidateProgram, AcceptsPyTorchsValidExamples) {
  EXPECT_EQ(errorOf(programFromCsv("0F0,0B0\n1F0,1B0\n")), "");
  EXPECT_EQ(errorOf(programFromCsv("0F0,0I0,0W0\n1F0,1I0,1W0\n")), "");
}

// test_invalid_schedule_missing_rank: a 2-rank schedule with one rank's list.
TEST(ValidateProgram, MissingRank) {
  Program p = programFromCsv("0F0,0B0\n");
  p.num_ranks = 2;
  p.num_stages = 2;
  p.stage_to_rank = {0, 1};
  EXPECT_THAT(errorOf(p), HasSubstr("Schedule has incorrect number of ranks - expected 2, actual 1"));
}

// test_invalid_schedule_missing_action: forwards without backwards.
TEST(ValidateProgram, MissingBackward) {
  Program p = programFromCsv("0F0\n1F0\n");
  std::string error = errorOf(p);
  EXPECT_THAT(error, HasSubstr("rule \"B + (I+W)/2 = microbatches\" broken"));
  EXPECT_THAT(error, HasSubstr("expected 1 total backwards, but got B=0, I=0, W=0"));
  EXPECT_THAT(error, HasSubstr("Full pipeline schedule:"));
}

TEST(ValidateProgram, BackwardBeforeForwardMarksTheStep) {
  Program p = programFromCsv("0F0,0F1,0B1,0B0\n,1F0,1B0,1B1,1F1\n");
  std::string error = errorOf(p);
  EXPECT_THAT(error, HasSubstr("rule \"F before I/B\" broken: Rank 1, step 3: Running Full "
                               "Backward for stage 1, microbatch 1 without first running Forward"));
  EXPECT_THAT(error, HasSubstr("move 1F1 before 1B1"));
  EXPECT_THAT(error, HasSubstr("Step 3: 0B0    1B1    <-- ERROR HERE\n"));
}

TEST(ValidateProgram, WeightBeforeInputGradient) {
  EXPECT_THAT(errorOf(programFromCsv("0F0,0W0,0I0\n")),
              HasSubstr("Rank 0, step 1: Running Backward Weight for stage 0, microbatch 0 "
                        "without first running Backward Input"));
}

TEST(ValidateProgram, InputGradientBeforeForward) {
  EXPECT_THAT(errorOf(programFromCsv("0I0,0F0,0W0\n")),
              HasSubstr("Running Backward Input for stage 0, microbatch 0 without first running "
                        "Forward"));
}

TEST(ValidateProgram, ForwardCount) {
  Program p = programFromCsv("0F0,0B0,0B1\n");
  EXPECT_THAT(errorOf(p), HasSubstr("without first running Forward"));
  p = programFromCsv("0F0,0B0\n");
  p.num_microbatches = 2;
  EXPECT_THAT(errorOf(p), HasSubstr("Got 1 F microbatches for stage 0, expected 2"));
}

TEST(ValidateProgram, UnequalInputAndWeightCounts) {
  EXPECT_THAT(errorOf(programFromCsv("0F0,0F1,0I0,0I1,0W0\n")),
              HasSubstr("I and W must have equal counts, but got I=2, W=1"));
}

TEST(ValidateProgram, StageOnTwoRanks) {
  Program p = programFromCsv("0F0,0B0\n1F0,1B0\n");
  p.actions[1].push_back(parseAction("0F0"));
  EXPECT_THAT(errorOf(p), HasSubstr("Rank 1, step 2: Running Forward for stage 0, microbatch 0 "
                                    "a second time"));
  p = programFromCsv("0F0,0B0\n1F0,1B0\n");
  p.actions[1][1] = parseAction("0B0");
  p.actions[0][1] = parseAction("1B0");
  EXPECT_THAT(errorOf(p), HasSubstr("Rank 0, step 1: Running Full Backward for stage 1"));
}

TEST(ValidateProgram, StageOffItsStageToRankRank) {
  Program p = programFromCsv("0F0,1F0,1B0,0B0\n");
  p.num_ranks = 2;
  p.actions.emplace_back();
  p.stage_to_rank = {0, 1};
  EXPECT_THAT(errorOf(p), HasSubstr("1F0 runs on rank 0, but stage_to_rank puts stage 1 on rank 1"));
}

TEST(ValidateProgram, RangesAndRepeats) {
  Program p = programFromCsv("0F0,0B0\n");
  p.actions[0].push_back(parseAction("0F5"));
  EXPECT_THAT(errorOf(p), HasSubstr("names microbatch 5, expected a microbatch in 0..0"));
  p = programFromCsv("0F0,0B0\n");
  p.actions[0].push_back(parseAction("3F0"));
  EXPECT_THAT(errorOf(p), HasSubstr("names stage 3, expected a stage in 0..0"));
  EXPECT_THAT(errorOf(programFromCsv("0F0,0B0,0B0\n")), HasSubstr("after its backward already ran"));
  EXPECT_THAT(errorOf(programFromCsv("0F0,0I0,0W0,0W0\n")), HasSubstr("a second time"));
}

TEST(ValidateProgram, PyTorchArtifactsIncludingOverlapAreValid) {
  for (const char* name : {"dualpipev_4rank_10mb.csv", "zb1p_2rank_2stagep_compute.csv",
                           "zb1p_2rank_2stagep_comms.csv"}) {
    EXPECT_EQ(errorOf(programFromCsv(readGolden(name))), "") << name;
  }
}

}  // namespace
}  // namespace pipeforge::schedules
