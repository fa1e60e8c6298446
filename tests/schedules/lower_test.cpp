#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "tests/schedules/golden.h"

#include "schedules/csv.h"
#include "schedules/lower.h"
#include "schedules/simulate_unit.h"
#include "schedules/validate.h"

namespace pipeforge::schedules {
namespace {

using testing::readGolden;

// PyTorch's test_csv: the ZB1P compute artifact, I/W merged and send/recv
// added, equals the comms artifact row for row and simulates in 113 steps.
TEST(LowerForExecution, Zb1pArtifactLowersToPyTorchsCommsArtifactIn113Steps) {
  Program compute = programFromCsv(readGolden("zb1p_2rank_2stagep_compute.csv"));
  Program expected = programFromCsv(readGolden("zb1p_2rank_2stagep_comms.csv"));
  Program lowered = addSendRecv(mergeBackward(compute));
  ASSERT_EQ(lowered.actions.size(), expected.actions.size());
  for (std::size_t rank = 0; rank < expected.actions.size(); ++rank) {
    EXPECT_EQ(lowered.actions[rank], expected.actions[rank]) << "rank " << rank;
  }
  EXPECT_EQ(programToCsv(lowered), readGolden("zb1p_2rank_2stagep_comms.csv"));
  EXPECT_EQ(simulateUnit(lowered).num_steps, 113);
  EXPECT_EQ(lowerForExecution(compute), lowered);
}

// PyTorch's runtime lowering (_prepare_schedule_with_comms): unshard/reshard,
// reduce_grad, then send/recv; the result still validates and simulates.
TEST(LowerForExecution, RuntimePassPipelineOnDualPipeV) {
  Program compute = programFromCsv(readGolden("dualpipev_4rank_10mb.csv"));
  Program lowered = addSendRecv(addReduceGrad(addUnshardReshard(compute, 3)));
  EXPECT_NO_THROW(validateProgram(lowered));
  UnitSimulation sim = simulateUnit(lowered);
  for (int rank = 0; rank < 4; ++rank) {
    std::size_t ran = 0;
    for (const auto& cell : sim.timeline[rank]) ran += cell ? 1 : 0;
    EXPECT_EQ(ran, lowered.actions[rank].size());
    EXPECT_GE(sim.num_steps, static_cast<int>(lowered.actions[rank].size()));
  }
  // Each of the 8 stages reduces its gradients exactly once.
  int reduces = 0;
  for (const auto& rank : lowered.actions) {
    for (const auto& cell : rank) reduces += cell->type == ActionType::kReduceGrad ? 1 : 0;
  }
  EXPECT_EQ(reduces, 8);
}

}  // namespace
}  // namespace pipeforge::schedules
