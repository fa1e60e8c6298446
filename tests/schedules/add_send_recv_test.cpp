#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/schedules/golden.h"

#include "schedules/csv.h"
#include "schedules/lower.h"
#include "schedules/simulate_unit.h"

namespace pipeforge::schedules {
namespace {

using testing::readGolden;

using ::testing::HasSubstr;

// PyTorch's test_send_recv "simple_2_rank_2_stage": compute, expected comms,
// and 11 simulated steps.
TEST(AddSendRecv, TwoRanksTwoStagesMatchesPyTorchAndSimulatesIn11Steps) {
  Program compute = programFromCsv(
      "0F0,0F1,   ,0B0,   ,0B1\n"
      "   ,1F0,1B0,1F1,1B1,   \n");
  EXPECT_EQ(compute.stage_to_rank, (std::vector<int>{0, 1}));
  Program comms = addSendRecv(compute);
  EXPECT_EQ(programToCsv(comms),
            "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
            "1RECV_F0,1RECV_F1,1F0,1B0,1SEND_B0,1F1,1B1,1SEND_B1\n");
  EXPECT_EQ(simulateUnit(comms).num_steps, 11);
}

// PyTorch's test_send_recv "v_2_rank_4_stage": stages 1 and 2 share rank 1,
// so 1F->2F and 2B->1B need no communication; 24 simulated steps.
TEST(AddSendRecv, VLayoutTwoRanksFourStagesMatchesPyTorchAndSimulatesIn24Steps) {
  Program compute = programFromCsv(
      "0F0,0F1,   ,3F0,3B0,3F1,3B1,0B0,3W0,0B1,3W1,0W0,0W1\n"
      "   ,1F0,2F0,1F1,2F1,2B0,1B0,2B1,1B1,2W0,2W1,1W0,1W1\n");
  EXPECT_EQ(compute.stage_to_rank, (std::vector<int>{0, 1, 1, 0}));
  Program comms = addSendRecv(compute);
  EXPECT_EQ(programToCsv(comms),
            "0F0,0SEND_F0,0F1,0SEND_F1,3RECV_F0,3F0,3B0,3SEND_B0,3RECV_F1,3F1,3B1,3SEND_B1,"
            "0RECV_B0,0B0,3W0,0RECV_B1,0B1,3W1,0W0,0W1\n"
            "1RECV_F0,1RECV_F1,1F0,2F0,2SEND_F0,1F1,2RECV_B0,2F1,2SEND_F1,2B0,2RECV_B1,1B0,"
            "1SEND_B0,2B1,1B1,1SEND_B1,2W0,2W1,1W0,1W1\n");
  EXPECT_EQ(simulateUnit(comms).num_steps, 24);
}

TEST(AddSendRecv, NoCommunicationBetweenStagesOnOneRank) {
  Program compute = programFromCsv("0F0,1F0,1B0,0B0\n");
  EXPECT_EQ(programToCsv(addSendRecv(compute)), "0F0,1F0,1B0,0B0\n");
}

// OVERLAP_F_B (V layout, stages 0,3 on rank 0 and 1,2 on rank 1) is placed
// once all its parts are ready, followed by a send for each part that
// crosses ranks: 0F2 forward to stage 1, 3B0 backward to stage 2.
TEST(AddSendRecv, OverlapSendsForEachPart) {
  Program compute = programFromCsv(
      "0F0,0F1,3F0,(0F2;3B0)OVERLAP_F_B,3F1,3B1,3F2,3B2,0B0,0B1,0B2\n"
      "1F0,2F0,1F1,2F1,2B0,1B0,1F2,2F2,2B1,1B1,2B2,1B2\n");
  EXPECT_EQ(compute.stage_to_rank, (std::vector<int>{0, 1, 1, 0}));
  Program comms = addSendRecv(compute);
  std::string csv = programToCsv(comms);
  std::string rank0 = csv.substr(0, csv.find('\n'));
  EXPECT_THAT(rank0, HasSubstr("3RECV_F0,3F0,(0F2;3B0)OVERLAP_F_B,0SEND_F2,3SEND_B0,"));
  EXPECT_GT(simulateUnit(comms).num_steps, 0);
}

TEST(AddSendRecv, ZeroBubbleScheduleLowersWithoutMerging) {
  // As in PyTorch's test_pipeline_order_flex_and_zero_bubble: I/W kept split.
  Program compute = programFromCsv(readGolden("zb1p_2rank_2stagep_compute.csv"));
  Program comms = addSendRecv(compute);
  EXPECT_NO_THROW(simulateUnit(comms));
}

TEST(AddSendRecv, RejectsInputThatAlreadyCommunicates) {
  try {
    addSendRecv(programFromCsv("0F0,0SEND_F0\n1RECV_F0,1F0\n"));
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("expects a compute-only schedule"));
    EXPECT_THAT(e.what(), HasSubstr("rank 0, step 1 already holds 0SEND_F0"));
  }
}

TEST(AddSendRecv, MisorderedComputeScheduleCannotBeLowered) {
  // Rank 0 wants 0B0 before its forward reached rank 1.
  try {
    addSendRecv(programFromCsv("0B0,0F0\n1F0,1B0\n"));
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot be lowered"));
    EXPECT_THAT(e.what(), HasSubstr("rank 0 at step 0: 0B0 waits for its input (1I0 or 1B0"));
    EXPECT_THAT(e.what(), HasSubstr("rank 1 at step 0: 1F0 waits for its input (0F0"));
  }
}

TEST(AddSendRecv, RejectsMalformedPrograms) {
  Program p = programFromCsv("0F0,0B0\n1F0,1B0\n");
  p.stage_to_rank = {0, 0};  // 1F0 sits on rank 1
  try {
    addSendRecv(p);
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("addSendRecv input: rank 1, step 0"));
    EXPECT_THAT(e.what(), HasSubstr("stage_to_rank puts stage 1 on rank 0"));
  }
}

}  // namespace
}  // namespace pipeforge::schedules
