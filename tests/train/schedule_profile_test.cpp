// The profiling program of `pipeline.schedule: auto` and the costs made of
// its timings (train/schedule_profile.h).
#include "train/schedule_profile.h"

#include <gtest/gtest.h>

#include <algorithm>

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

// Note [Action overheads]: posting a send is cut out of the action that
// posts it and counted per message, as is a RECV less its wait; what lies
// outside every action and span is the runtime's own, per action.
TEST(MedianOverheads, SendsRecvsAndTheTimeBetweenActions) {
  runtime::StepProfile a;
  a.step_s = 20e-3;
  a.steps = {timed("1RECV_F0", 0, 0.5),  // 0.5 ms taking the message in
             timed("1F0", 1, 5, 1),      // 4 - 1 waited - 0.5 sending = 2.5 ms of compute
             timed("1SEND_F0", 5, 5),
             timed("1RECV_B0", 6, 7, 0.6),  // 0.4
             timed("1B0", 8, 14)};
  a.spans = {runtime::TimedSpan{runtime::SpanKind::kWait, "wait recv 1F0 from rank 0", 1e-3, 2e-3},
             runtime::TimedSpan{runtime::SpanKind::kSend, "send 1F0 to rank 2", 4.5e-3, 5e-3, 64},
             runtime::TimedSpan{runtime::SpanKind::kAllReduce, "all-reduce", 15e-3, 18e-3}};
  const std::vector<double> t = medianActionTimes({a}, 2);
  EXPECT_NEAR(t[kTimedKinds + static_cast<int>(TimedKind::kForward)], 2.5, 1e-9);
  const ActionOverheads o = medianOverheads({a});
  EXPECT_NEAR(o.send_ms, 0.5, 1e-9);
  EXPECT_NEAR(o.recv_ms, 0.45, 1e-9);  // median of 0.5 and 0.4
  // 20 ms less 11.5 ms of actions less the 3 ms all-reduce between them, over F and B.
  EXPECT_NEAR(o.action_ms, (20 - 11.5 - 3) / 2, 1e-9);
  // One rank alone sends and receives nothing.
  runtime::StepProfile alone;
  alone.step_s = 4e-3;
  alone.steps = {timed("0F0", 0, 1), timed("0B0", 1, 3)};
  const ActionOverheads none = medianOverheads({alone});
  EXPECT_EQ(none.send_ms, 0.0);
  EXPECT_EQ(none.recv_ms, 0.0);
  EXPECT_NEAR(none.action_ms, 0.5, 1e-9);
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

runtime::TimedStep withMemory(const char* action, std::int64_t delta, std::int64_t peak = 0) {
  runtime::TimedStep t = timed(action, 0, 1);
  t.memory_delta = delta;
  t.memory_peak = std::max(peak, delta);
  return t;
}

TEST(MedianActionMemory, RecvCountsWithItsComputeAndBackwardsRelease) {
  // Stage 1 on this rank: microbatch 0 whole (B), microbatches 1 and 3 split.
  // The received input (100) counts with F; the gradient received (10)
  // with the I or B that consumes it; W of microbatch 1 also made nothing.
  runtime::StepProfile p;
  // Temporaries: each F went 300, 200 and 400 above its end, B0 50 above its start.
  p.steps = {withMemory("1RECV_F0", 100), withMemory("1F0", 900, 1200), withMemory("1SEND_F0", 0),
             withMemory("1RECV_B0", 10),  withMemory("1B0", -1010, 50),
             withMemory("1RECV_F1", 100), withMemory("1F1", 1000, 1200), withMemory("1RECV_B1", 10),
             withMemory("1I1", -710),     withMemory("1W1", -400),
             withMemory("1RECV_F3", 100), withMemory("1F3", 800, 1200),  withMemory("1RECV_B3", 10),
             withMemory("1I3", -610),     withMemory("1W3", -300)};
  const std::vector<double> m = medianActionMemory({p}, 2);
  ASSERT_EQ(m.size(), 2u * kTimedKinds + 2);
  EXPECT_EQ(stageTemporaries(m, 2), (std::vector<double>{0.0, 300.0}));  // the median F's
  for (int k = 0; k < kTimedKinds; ++k) EXPECT_EQ(m[k], 0.0);  // stage 0: not this rank's
  EXPECT_DOUBLE_EQ(m[kTimedKinds + static_cast<int>(TimedKind::kForward)], 1000.0);  // median of 1000, 1100, 900
  EXPECT_DOUBLE_EQ(m[kTimedKinds + static_cast<int>(TimedKind::kBackwardInput)], 650.0);  // 700, 600
  EXPECT_DOUBLE_EQ(m[kTimedKinds + static_cast<int>(TimedKind::kBackwardWeight)], 350.0);  // 400, 300
  EXPECT_DOUBLE_EQ(m[kTimedKinds + static_cast<int>(TimedKind::kFullBackward)], 1000.0);

  const sch::CostModel costs = costModelFromMeasurements(std::vector<double>(8, 1.0), m, 2);
  EXPECT_DOUBLE_EQ(costs.stages[1].activation_memory, 1000.0);
  ASSERT_TRUE(costs.stages[1].weight_memory_share.has_value());
  EXPECT_DOUBLE_EQ(*costs.stages[1].weight_memory_share, 350.0 / 1000.0);  // W's release over F's keep
  // F allocates the bytes, I releases all but the stage's W share, W the rest.
  EXPECT_DOUBLE_EQ(costs.memoryChange(sch::ActionType::kForward, 1), 1000.0);
  EXPECT_DOUBLE_EQ(costs.memoryChange(sch::ActionType::kBackwardInput, 1), -650.0);
  EXPECT_DOUBLE_EQ(costs.memoryChange(sch::ActionType::kBackwardWeight, 1), -350.0);
  EXPECT_FALSE(costs.stages[0].weight_memory_share.has_value());  // nothing measured: the model's share
  EXPECT_DOUBLE_EQ(costs.stages[0].activation_memory, 0.0);

  // An I that keeps more for W than it frees: W frees 1500 of the 1000 F kept.
  std::vector<double> allocating = m;
  allocating[kTimedKinds + static_cast<int>(TimedKind::kBackwardInput)] = -500;
  allocating[kTimedKinds + static_cast<int>(TimedKind::kBackwardWeight)] = 1500;
  const sch::CostModel more = costModelFromMeasurements(std::vector<double>(8, 1.0), allocating, 2);
  EXPECT_DOUBLE_EQ(more.memoryChange(sch::ActionType::kBackwardInput, 1), 500.0);
  EXPECT_DOUBLE_EQ(more.memoryChange(sch::ActionType::kBackwardWeight, 1), -1500.0);
}

}  // namespace
}  // namespace pipeforge::train
