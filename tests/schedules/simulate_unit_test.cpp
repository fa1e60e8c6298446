#include "schedules/simulate_unit.h"

#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/schedules/golden.h"

#include "schedules/csv.h"
#include "schedules/lower.h"

namespace pipeforge::schedules {
namespace {

using testing::readGolden;

using ::testing::HasSubstr;

// Step by step: at step 1 rank 1 receives what rank 0 sent earlier in the
// same step (lower ranks go first); at step 4 rank 0 first idles, then gets
// its second chance after rank 1's SEND_B0 and receives in that same step.
TEST(SimulateUnit, SameStepVisibilityAndSecondPass) {
  Program p = programFromCsv(
      "0F0,0SEND_F0,0RECV_B0,0B0\n"
      "1RECV_F0,1F0,1B0,1SEND_B0\n");
  UnitSimulation sim = simulateUnit(p);
  EXPECT_EQ(sim.num_steps, 6);
  EXPECT_EQ(formatCsv(sim.timeline),
            "0F0,0SEND_F0,,,0RECV_B0,0B0\n"
            ",1RECV_F0,1F0,1B0,1SEND_B0\n");
}

TEST(SimulateUnit, PyTorchsLoweredExamples) {
  EXPECT_EQ(simulateUnit(addSendRecv(programFromCsv("0F0,0F1,,0B0,,0B1\n,1F0,1B0,1F1,1B1,\n")))
                .num_steps,
            11);
}

TEST(SimulateUnit, IgnoresIdleCellsOfTheInput) {
  Program p = programFromCsv("0F0,,,0B0\n");
  UnitSimulation sim = simulateUnit(p);
  EXPECT_EQ(sim.num_steps, 2);
  EXPECT_EQ(formatCsv(sim.timeline), "0F0,0B0\n");
}

TEST(SimulateUnit, DeadlockNamesWhatEachRankWaitsForAndMarksTheStep) {
  // Rank 0 waits for a gradient before sending its activation.
  Program p = programFromCsv(
      "0RECV_B0,0F0,0SEND_F0,0B0\n"
      "1RECV_F0,1F0,1B0,1SEND_B0\n");
  try {
    simulateUnit(p);
    FAIL();
  } catch (const ScheduleError& e) {
    std::string what = e.what();
    EXPECT_THAT(what, HasSubstr("the schedule deadlocks: at step 0"));
    EXPECT_THAT(what, HasSubstr("rank 0: next action 0RECV_B0 waits for 1SEND_B0 on rank 1"));
    EXPECT_THAT(what, HasSubstr("rank 1: next action 1RECV_F0 waits for 0SEND_F0 on rank 0"));
    EXPECT_THAT(what, HasSubstr("Step 0:" + std::string(15, ' ') + "<-- ERROR HERE\n"));
  }
}

TEST(SimulateUnit, ComputeOnlyScheduleAcrossRanksDeadlocksAfterProgress) {
  try {
    simulateUnit(programFromCsv("0F0,0B0\n1F0,1B0\n"));
    FAIL();
  } catch (const ScheduleError& e) {
    std::string what = e.what();
    EXPECT_THAT(what, HasSubstr("at step 1"));
    EXPECT_THAT(what, HasSubstr("0B0 waits for 0RECV_B0"));
    EXPECT_THAT(what, HasSubstr("1F0 waits for 1RECV_F0"));
    EXPECT_THAT(what, HasSubstr("Step 0: 0F0"));
    EXPECT_THAT(what, HasSubstr("<-- ERROR HERE"));
  }
}

TEST(SimulateUnit, OverlapAndFsdpActionsAreSupported) {
  Program p = addSendRecv(addReduceGrad(
      addUnshardReshard(programFromCsv(readGolden("dualpipev_4rank_10mb.csv")), 3)));
  UnitSimulation sim = simulateUnit(p);
  std::size_t total = 0;
  for (const auto& rank : p.actions) total += rank.size();
  std::size_t ran = 0;
  for (const auto& rank : sim.timeline) {
    for (const auto& cell : rank) ran += cell ? 1 : 0;
  }
  EXPECT_EQ(ran, total);
}

TEST(SimulateUnit, RejectsMalformedProgram) {
  Program p = programFromCsv("0F0,0B0\n");
  p.stage_to_rank = {3};
  EXPECT_THROW(simulateUnit(p), ScheduleError);
}

}  // namespace
}  // namespace pipeforge::schedules
