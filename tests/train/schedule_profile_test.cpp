// The profiling program of `pipeline.schedule: auto` and the costs made of
// its timings (train/schedule_profile.h).
#include "train/schedule_profile.h"

#include <gtest/gtest.h>

#include "schedules/action.h"
#include "schedules/simulate_unit.h"
#include "schedules/validate.h"

namespace pipeforge::train {
namespace {

namespace sch = pipeforge::schedules;

// A rank's compute actions in order, as text.
std::string computeRow(const sch::Program& p, int rank) {
  std::string out;
  for (const auto& a : p.actions[rank]) {
    if (!a || !sch::isCompute(a->type)) continue;
    out += (out.empty() ? "" : " ") + sch::formatAction(*a);
  }
  return out;
}

TEST(ProfilingProgram, OneMicrobatchAtATimeFullThenSplit) {
  const sch::Program p = profilingProgram(2, 2, 3);
  EXPECT_EQ(p.num_stages, 4);
  EXPECT_EQ(p.num_microbatches, 3);
  EXPECT_EQ(p.stage_to_rank, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_TRUE(sch::hasSendRecv(p));  // lowered, so the runner keeps I and W apart
  EXPECT_NO_THROW(sch::validateProgram(p));
  EXPECT_NO_THROW(sch::simulateUnit(p));
  EXPECT_EQ(computeRow(p, 0), "0F0 2F0 2B0 0B0 0F1 2F1 2I1 0I1 2W1 0W1 0F2 2F2 2B2 0B2");
  EXPECT_EQ(computeRow(p, 1), "1F0 3F0 3B0 1B0 1F1 3F1 3I1 1I1 3W1 1W1 1F2 3F2 3B2 1B2");
}

TEST(ProfilingProgram, RunsForEveryShape) {
  for (int ranks : {1, 2, 3}) {
    for (int per_rank : {1, 2}) {
      for (int m : {1, 2, 5}) {
        SCOPED_TRACE(::testing::Message() << ranks << " ranks, " << per_rank << " per rank, " << m << " microbatches");
        const sch::Program p = profilingProgram(ranks, per_rank, m);
        EXPECT_NO_THROW(sch::validateProgram(p));
        EXPECT_NO_THROW(sch::simulateUnit(p));
      }
    }
  }
}

runtime::TimedStep timed(const char* action, double start_ms, double end_ms, double wait_ms = 0.0) {
  return runtime::TimedStep{sch::parseAction(action), start_ms / 1e3, end_ms / 1e3, wait_ms / 1e3};
}

TEST(MedianActionTimes, MediansOfComputeTimeWithoutWaits) {
  runtime::StepProfile a;
  a.steps = {timed("0F0", 0, 5),         // 5 ms: the cold first call
             timed("0SEND_F0", 5, 5.5),  // not a compute action
             timed("0F1", 6, 9, 1),      // 3 - 1 ms waited = 2
             timed("0B0", 9, 13), timed("0I1", 13, 14.5, 0.5), timed("0W1", 14.5, 16)};
  runtime::StepProfile b;
  b.steps = {timed("0F0", 0, 3)};  // 3
  const std::vector<double> t = medianActionTimes({a, b}, 2);
  ASSERT_EQ(t.size(), 2u * kTimedKinds);
  EXPECT_NEAR(t[static_cast<int>(TimedKind::kForward)], 3.0, 1e-9);  // median of 5, 2, 3
  EXPECT_NEAR(t[static_cast<int>(TimedKind::kBackwardInput)], 1.0, 1e-9);
  EXPECT_NEAR(t[static_cast<int>(TimedKind::kBackwardWeight)], 1.5, 1e-9);
  EXPECT_NEAR(t[static_cast<int>(TimedKind::kFullBackward)], 4.0, 1e-9);
  for (int k = 0; k < kTimedKinds; ++k) EXPECT_EQ(t[kTimedKinds + k], 0.0);  // stage 1: not this rank's
}

TEST(CostModelFromTimes, FillsWhatWasNotTimed) {
  // Stage 0 timed everything; stage 1 only F and B (m = 1, or one rank);
  // stage 2 only F, I and W; stage 3 a zero F.
  const std::vector<double> t = {1, 0.6, 0.5, 1.0,  2, 0, 0, 3.0,  1, 0.7, 0.4, 0,  0, 1, 1, 2};
  const sch::CostModel m = costModelFromTimes(t, 4);
  ASSERT_EQ(m.stages.size(), 4u);
  EXPECT_NO_THROW(m.check(4));
  EXPECT_EQ(m.comm_latency, 0.0);
  EXPECT_DOUBLE_EQ(m.stages[0].backward_input, 0.6);
  EXPECT_DOUBLE_EQ(m.stages[0].fullBackward(), 1.0);
  EXPECT_DOUBLE_EQ(m.stages[1].backward_input, 1.5);
  EXPECT_DOUBLE_EQ(m.stages[1].backward_weight, 1.5);
  EXPECT_DOUBLE_EQ(m.stages[2].fullBackward(), 0.7 + 0.4);
  EXPECT_DOUBLE_EQ(m.stages[3].forward, kMinActionMs);
}

}  // namespace
}  // namespace pipeforge::train
