#include "runtime/failure_report.h"

#include <gtest/gtest.h>

namespace pipeforge::runtime {
namespace {

using schedules::Action;
using schedules::parseAction;

// Two stages on two ranks, one microbatch: F then B on each.
schedules::Program twoRanks() {
  schedules::Program p;
  p.num_ranks = 2;
  p.num_stages = 2;
  p.num_microbatches = 1;
  p.stage_to_rank = {0, 1};
  p.actions = {{parseAction("0F0"), std::nullopt, std::nullopt, parseAction("0B0")},
               {std::nullopt, parseAction("1F0"), parseAction("1B0"), std::nullopt}};
  return p;
}

TEST(FailureReportTest, PlaceNamesTheRankStepAndAction) {
  const Action b = parseAction("1B0");
  EXPECT_EQ(failurePlace(3, &b, 2), "rank 3 at step 2 (action 1B0)");
  EXPECT_EQ(failurePlace(3, nullptr, 4), "rank 3 at the end of the step");
}

TEST(FailureReportTest, AFailedActionShowsTheGridWithItsStepMarked) {
  const schedules::Program program = twoRanks();
  const Action b = parseAction("1B0");
  // Global rank 3 is pipeline rank 1 of the second replica.
  EXPECT_EQ(failureReport(program, 1, 3, &b, 2, "stage 1 backward failed"),
            "rank 3 at step 2 (action 1B0) failed: stage 1 backward failed\n"
            "schedule (rank 1 is column 'Rank 1'):\n" +
                schedules::formatGrid(program, 2));
  EXPECT_NE(schedules::formatGrid(program, 2), schedules::formatGrid(program));  // the step is marked
}

TEST(FailureReportTest, AFailureAtTheStepsEndHasNoGrid) {
  EXPECT_EQ(failureReport(twoRanks(), 0, 0, nullptr, 4, "a send timed out"),
            "rank 0 at the end of the step failed: a send timed out\n");
}

TEST(FailureReportTest, ARankStoppedByAPeerQuotesItsReport) {
  const Action f = parseAction("0F0");
  EXPECT_EQ(stoppedByPeerReport(0, &f, 0, "rank 1 at step 2 (action 1B0) failed: boom\n"),
            "rank 0 at step 0 (action 0F0) stopped because another rank failed:\n"
            "rank 1 at step 2 (action 1B0) failed: boom\n");
}

}  // namespace
}  // namespace pipeforge::runtime
