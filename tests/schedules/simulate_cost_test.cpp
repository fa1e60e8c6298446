#include "schedules/simulate_cost.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/schedules/golden.h"
#include <nlohmann/json.hpp>

#include "schedules/cost_model.h"
#include "schedules/csv.h"
#include "schedules/generate.h"
#include "schedules/lower.h"
#include "schedules/order_evaluator.h"
#include "schedules/rank_orders.h"

namespace pipeforge::schedules {
namespace {

using ::testing::HasSubstr;

using testing::readGolden;

const TimedAction& find(const CostSimulation& sim, const std::string& text) {
  for (const TimedAction& e : sim.events) {
    if (formatAction(e.action) == text) return e;
  }
  ADD_FAILURE() << "no event " << text;
  static TimedAction none;
  return none;
}

// --- cost model ------------------------------------------------------------

TEST(CostModel, ParsesTheCliList) {
  CostModel c = parseCostList("1,1.3,0.7,0.1");
  EXPECT_DOUBLE_EQ(c.stage(5).forward, 1.0);
  EXPECT_DOUBLE_EQ(c.stage(0).backward_input, 1.3);
  EXPECT_DOUBLE_EQ(c.stage(0).backward_weight, 0.7);
  EXPECT_DOUBLE_EQ(c.stage(0).fullBackward(), 2.0);
  EXPECT_DOUBLE_EQ(c.comm_latency, 0.1);
  EXPECT_DOUBLE_EQ(parseCostList("2,1,1").comm_latency, 0.0);
}

TEST(CostModel, RejectsMalformedLists) {
  EXPECT_THROW(parseCostList("1,2"), ScheduleError);
  EXPECT_THROW(parseCostList("1,2,3,4,5"), ScheduleError);
  EXPECT_THROW(parseCostList("1,x,3"), ScheduleError);
  EXPECT_THROW(parseCostList("1,,3"), ScheduleError);
  EXPECT_THROW(parseCostList("0,1,1"), ScheduleError);   // durations must be positive
  EXPECT_THROW(parseCostList("1,1,1,-1"), ScheduleError);
  try {
    parseCostList("1;2;3");
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("F,I,W"));
  }
}

TEST(CostModel, JsonRoundTripAndPerStageCosts) {
  nlohmann::json j = {{"comm_latency", 0.5},
                      {"weight_memory_share", 0.25},
                      {"stages",
                       {{{"forward", 1.0}, {"backward_input", 2.0}},
                        {{"forward", 3.0}, {"full_backward", 4.5}, {"activation_memory", 2.0}}}}};
  CostModel c = costModelFromJson(j);
  ASSERT_EQ(c.stages.size(), 2u);
  EXPECT_DOUBLE_EQ(c.stage(1).forward, 3.0);
  EXPECT_DOUBLE_EQ(c.stage(1).fullBackward(), 4.5);
  EXPECT_DOUBLE_EQ(c.stage(0).fullBackward(), 3.0);  // I + W
  EXPECT_THROW(c.stage(2), ScheduleError);
  EXPECT_THROW(c.check(3), ScheduleError);
  CostModel back = costModelFromJson(costModelToJson(c));
  EXPECT_EQ(costModelToJson(back), costModelToJson(c));
  EXPECT_THROW(costModelFromJson({{"forwrd", 1.0}}), ScheduleError);
  EXPECT_THROW(costModelFromJson({{"forward", "fast"}}), ScheduleError);
}

// --- compute-only programs ---------------------------------------------------

// 1F1B on 2 ranks, F=1, B=2: the textbook picture.
TEST(CostModel, MemoryChangePerActionType) {
  CostModel c = CostModel::uniform(1, 1, 1);
  c.stages[0].activation_memory = 2.0;
  c.weight_memory_share = 0.25;
  EXPECT_EQ(c.memoryChange(ActionType::kForward, 3), 2.0);
  EXPECT_EQ(c.memoryChange(ActionType::kBackwardInput, 3), -1.5);
  EXPECT_EQ(c.memoryChange(ActionType::kBackwardWeight, 3), -0.5);
  EXPECT_EQ(c.memoryChange(ActionType::kFullBackward, 3), -2.0);
  EXPECT_EQ(c.memoryChange(ActionType::kSendF, 3), 0.0);
}

// A stage's own weight_memory_share (measured per stage by `schedule:
// auto`) overrides the model's, survives JSON, and must be a fraction.
TEST(CostModel, PerStageWeightMemoryShare) {
  CostModel c = CostModel::uniform(1, 1, 1);
  c.stages = {c.stages[0], c.stages[0]};
  c.stages[1].activation_memory = 1000;
  c.stages[1].weight_memory_share = 0.3;
  EXPECT_DOUBLE_EQ(c.memoryChange(ActionType::kBackwardInput, 0), -0.5);  // the model's 0.5
  EXPECT_DOUBLE_EQ(c.memoryChange(ActionType::kBackwardInput, 1), -700.0);
  EXPECT_DOUBLE_EQ(c.memoryChange(ActionType::kBackwardWeight, 1), -300.0);
  const CostModel back = costModelFromJson(costModelToJson(c));
  ASSERT_EQ(back.stages.size(), 2u);
  EXPECT_FALSE(back.stages[0].weight_memory_share.has_value());
  EXPECT_DOUBLE_EQ(back.stages[1].weight_memory_share.value_or(-1), 0.3);
  CostModel one = CostModel::uniform(1, 1, 1);
  one.stages[0].weight_memory_share = 0.25;  // one set for all stages keeps its own share too
  EXPECT_DOUBLE_EQ(costModelFromJson(costModelToJson(one)).weightMemoryShare(3), 0.25);
  c.stages[1].weight_memory_share = 1.5;  // I keeps more than it frees: it allocates, W frees it all
  EXPECT_NO_THROW(c.check(2));
  EXPECT_DOUBLE_EQ(c.memoryChange(ActionType::kBackwardInput, 1), 500.0);
  EXPECT_DOUBLE_EQ(c.memoryChange(ActionType::kBackwardWeight, 1), -1500.0);
  c.stages[1].weight_memory_share = -0.1;
  EXPECT_THROW(c.check(2), ScheduleError);
}

TEST(SimulateCost, OneFOneBOnTwoRanks) {
  Program p = programFromCsv("0F0,0F1,0B0,0F2,0B1,0B2\n1F0,1B0,1F1,1B1,1F2,1B2\n");
  CostModel c = CostModel::uniform(1, 1, 1);
  CostSimulation sim = simulateCost(p, c);
  EXPECT_DOUBLE_EQ(find(sim, "1F0").start, 1.0);
  EXPECT_DOUBLE_EQ(find(sim, "1B0").end, 4.0);
  EXPECT_DOUBLE_EQ(find(sim, "0B0").start, 4.0);
  // (m + p - 1)(F + B) = 4 * 3.
  EXPECT_DOUBLE_EQ(sim.makespan, 12.0);
  for (int r = 0; r < 2; ++r) {
    EXPECT_DOUBLE_EQ(sim.busy_time[r], 9.0);
    EXPECT_DOUBLE_EQ(sim.bubble_fraction[r], 0.25);  // (p-1)/(m+p-1)
  }
  EXPECT_DOUBLE_EQ(sim.totalBubbleFraction(), 0.25);
  EXPECT_DOUBLE_EQ(sim.peak_memory[0], 2.0);
  EXPECT_DOUBLE_EQ(sim.peak_memory[1], 1.0);
  // Events come by rank, then list order, and say what they waited for.
  ASSERT_EQ(sim.events.size(), 12u);
  EXPECT_EQ(sim.events[6].rank, 1);
  EXPECT_EQ(sim.events[6].step, 0);
  ASSERT_TRUE(sim.events[6].waited_on.has_value());
  EXPECT_EQ(formatAction(sim.events[*sim.events[6].waited_on].action), "0F0");
}

TEST(SimulateCost, CommLatencyOnlyBetweenRanks) {
  // V layout on 2 ranks: stages 1 and 2 share rank 1, so 1F -> 2F is free.
  Program p = programFromCsv(
      "0F0,3F0,3B0,0B0\n"
      "1F0,2F0,2B0,1B0\n");
  CostModel c = CostModel::uniform(1, 1, 1, 0.5);
  CostSimulation sim = simulateCost(p, c);
  EXPECT_DOUBLE_EQ(find(sim, "1F0").start, 1.5);   // crosses ranks
  EXPECT_DOUBLE_EQ(find(sim, "2F0").start, 2.5);   // same rank: no latency
  EXPECT_DOUBLE_EQ(find(sim, "3F0").start, 4.0);
  EXPECT_DOUBLE_EQ(find(sim, "3B0").start, 5.0);   // same rank as 3F0
  EXPECT_DOUBLE_EQ(find(sim, "2B0").start, 7.5);
  EXPECT_DOUBLE_EQ(find(sim, "1B0").start, 9.5);
  EXPECT_DOUBLE_EQ(find(sim, "0B0").start, 12.0);
  EXPECT_DOUBLE_EQ(sim.makespan, 14.0);
}

TEST(SimulateCost, SplitBackwardHoldsTheWeightShareUntilW) {
  Program p = programFromCsv("0F0,0F1,0I0,0I1,0W0,0W1\n");
  CostModel c = CostModel::uniform(1, 1, 1);
  c.weight_memory_share = 0.25;
  c.stages[0].activation_memory = 4.0;
  CostSimulation sim = simulateCost(p, c);
  EXPECT_DOUBLE_EQ(sim.peak_memory[0], 8.0);
  EXPECT_DOUBLE_EQ(sim.makespan, 6.0);
  // A third F after both I and one W: 1 (W1's share) + 4, below the first peak.
  Program q = programFromCsv("0F0,0F1,0I0,0I1,0W0,0F2,0I2,0W1,0W2\n");
  CostSimulation sq = simulateCost(q, c);
  EXPECT_DOUBLE_EQ(sq.peak_memory[0], 8.0);
  // Without the F2 the share shows in the low point; with share 1 nothing is
  // freed before W, so F2 lands on 4 (held for W1) + 4.
  c.weight_memory_share = 1.0;
  c.stages[0].activation_memory = 3.0;
  Program r = programFromCsv("0F0,0I0,0F1,0F2,0W0,0I1,0I2,0W1,0W2\n");
  EXPECT_DOUBLE_EQ(simulateCost(r, c).peak_memory[0], 9.0);  // F0 held until W0
}

TEST(SimulateCost, OverlapRunsBothHalvesBackToBack) {
  // Rank 0 overlaps the F of microbatch 1 with the B of microbatch 0.
  Program p = programFromCsv("0F0,(0F1;0B0)OVERLAP_F_B,0B1\n");
  CostModel c = CostModel::uniform(1, 1, 1);
  CostSimulation sim = simulateCost(p, c);
  ASSERT_EQ(sim.events.size(), 3u);
  EXPECT_DOUBLE_EQ(sim.events[1].start, 1.0);
  EXPECT_DOUBLE_EQ(sim.events[1].end, 4.0);  // F (1) + B (2)
  EXPECT_DOUBLE_EQ(sim.makespan, 6.0);
}

TEST(SimulateCost, DualPipeVGoldenRuns) {
  Program p = programFromCsv(readGolden("dualpipev_4rank_10mb.csv"));
  CostSimulation sim = simulateCost(p, CostModel::uniform(1, 1, 1, 0.1));
  EXPECT_GT(sim.makespan, 0.0);
  EXPECT_EQ(sim.busy_time.size(), 4u);
}

TEST(SimulateCost, DeadlockNamesTheStuckRanksAndShowsTheGrid) {
  // Rank 1 wants the gradient of microbatch 1 first; rank 0 wants 1's for microbatch 0.
  Program p = programFromCsv("0F0,0F1,0B0,0B1\n1F1,1B1,1F0,1B0\n");
  EXPECT_NO_THROW(simulateCost(p, CostModel::uniform(1, 1, 1)));
  Program bad = programFromCsv("0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n");
  try {
    simulateCost(bad, CostModel::uniform(1, 1, 1));
    FAIL() << "expected a deadlock";
  } catch (const ScheduleError& e) {
    std::string what = e.what();
    EXPECT_THAT(what, HasSubstr("deadlocks"));
    EXPECT_THAT(what, HasSubstr("rank 0 is stuck at step 1 (`0B0`), waiting for `1I0` or `1B0`"));
    EXPECT_THAT(what, HasSubstr("rank 1 is stuck at step 0 (`1F1`), waiting for `0F1`"));
    EXPECT_THAT(what, HasSubstr("Rank 0"));  // the grid
    EXPECT_THAT(what, HasSubstr("ERROR HERE"));
  }
}

TEST(SimulateCost, RejectsBrokenPrograms) {
  CostModel c = CostModel::uniform(1, 1, 1);
  Program p = programFromCsv("0F0,0B0\n1F0,1B0\n");
  Program wrong_rank = p;
  wrong_rank.stage_to_rank = {1, 0};
  EXPECT_THROW(simulateCost(wrong_rank, c), ScheduleError);
  Program repeat = programFromCsv("0F0,0F0,0B0\n1F0,1B0\n");
  try {
    simulateCost(repeat, c);
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("`0F0` runs twice"));
  }
  Program out_of_range = p;
  out_of_range.num_microbatches = 0;
  EXPECT_THROW(simulateCost(out_of_range, c), ScheduleError);
  CostModel three = c;
  three.stages.resize(3);
  EXPECT_THROW(simulateCost(p, three), ScheduleError);
}

// --- lowered programs -----------------------------------------------------------

TEST(SimulateCost, LoweredProgramsTakeTheirDataFromMessages) {
  // SEND/RECV present: the consumer waits for its RECV (posted earlier on its
  // rank) and for the SEND's data (SEND time + latency).
  Program p = programFromCsv(
      "0F0,0SEND_F0,0RECV_B0,0B0\n"
      "1RECV_F0,1F0,1B0,1SEND_B0\n");
  CostSimulation sim = simulateCost(p, CostModel::uniform(1, 1, 1, 0.25));
  EXPECT_DOUBLE_EQ(find(sim, "1F0").start, 1.25);
  EXPECT_DOUBLE_EQ(find(sim, "0B0").start, 4.5);
  EXPECT_DOUBLE_EQ(sim.makespan, 6.5);
  // A RECV after its consumer never helps: deadlock.
  Program late = programFromCsv(
      "0F0,0SEND_F0,0RECV_B0,0B0\n"
      "1F0,1RECV_F0,1B0,1SEND_B0\n");
  EXPECT_THROW(simulateCost(late, CostModel::uniform(1, 1, 1)), ScheduleError);
}

TEST(SimulateCost, LoweringWithoutMergingKeepsTheMakespan) {
  // Sends go right after their producer and receives before their consumer,
  // so the messages carry exactly the compute-only dependencies.
  Program compute = programFromCsv(readGolden("zb1p_2rank_2stagep_compute.csv"));
  CostModel c = CostModel::uniform(1, 1.3, 0.7, 0.2);
  CostSimulation plain = simulateCost(compute, c);
  CostSimulation lowered = simulateCost(addSendRecv(compute), c);
  EXPECT_DOUBLE_EQ(lowered.makespan, plain.makespan);
  EXPECT_EQ(lowered.peak_memory, plain.peak_memory);
  // Merging I+W into B sends the input gradient only after the W part: never faster.
  CostSimulation merged = simulateCost(lowerForExecution(compute), c);
  EXPECT_GE(merged.makespan, plain.makespan - 1e-12);
}

TEST(SimulateCost, GoldenLoweredScheduleRuns) {
  // PyTorch's own lowering of ZB1P (I+W merged into B where adjacent).
  Program comms = programFromCsv(readGolden("zb1p_2rank_2stagep_comms.csv"));
  Program compute = programFromCsv(readGolden("zb1p_2rank_2stagep_compute.csv"));
  CostModel c = CostModel::uniform(1, 1, 1);
  const double lowered = simulateCost(comms, c).makespan;
  EXPECT_GE(lowered, simulateCost(compute, c).makespan - 1e-12);
  EXPECT_DOUBLE_EQ(lowered, simulateCost(lowerForExecution(compute), c).makespan);
}

// Note [Action overheads]: a message costs its sender and its receiver, on
// the actions that make and take it, only where neighbouring stages sit on
// two ranks; every F, I, W and B pays the runtime's own overhead.
TEST(CostModel, OverheadsAreChargedToTheActionsOfEachCrossingOfTheLayout) {
  CostModel c = CostModel::uniform(1, 1.5, 0.5);
  c.send_overhead = 0.25;
  c.recv_overhead = 0.125;
  c.action_overhead = 0.0625;
  // Loop on 2 ranks: 0,2 on rank 0 and 1,3 on rank 1; every boundary crosses.
  const CostModel loop = c.withOverheadsCharged({0, 1, 0, 1});
  ASSERT_EQ(loop.stages.size(), 4u);
  EXPECT_FALSE(loop.hasOverheads());
  // Stage 0: F sends, its backward receives; stage 3: F receives, B sends.
  EXPECT_DOUBLE_EQ(loop.stages[0].forward, 1 + 0.0625 + 0.25);
  EXPECT_DOUBLE_EQ(loop.stages[0].backward_input, 1.5 + 0.0625 + 0.125);
  EXPECT_DOUBLE_EQ(loop.stages[0].backward_weight, 0.5 + 0.0625);
  EXPECT_DOUBLE_EQ(loop.stages[0].fullBackward(), 2 + 0.0625 + 0.125);
  EXPECT_DOUBLE_EQ(loop.stages[1].forward, 1 + 0.0625 + 0.125 + 0.25);
  EXPECT_DOUBLE_EQ(loop.stages[1].fullBackward(), 2 + 0.0625 + 0.125 + 0.25);
  EXPECT_DOUBLE_EQ(loop.stages[3].forward, 1 + 0.0625 + 0.125);
  EXPECT_DOUBLE_EQ(loop.stages[3].backward_input, 1.5 + 0.0625 + 0.25);
  // V: 0,3 on rank 0 and 1,2 on rank 1; 1 -> 2 stays on rank 1.
  const CostModel v = c.withOverheadsCharged({0, 1, 1, 0});
  EXPECT_DOUBLE_EQ(v.stages[1].forward, 1 + 0.0625 + 0.125);
  EXPECT_DOUBLE_EQ(v.stages[1].fullBackward(), 2 + 0.0625 + 0.25);
  EXPECT_DOUBLE_EQ(v.stages[2].forward, 1 + 0.0625 + 0.25);
  EXPECT_DOUBLE_EQ(v.stages[2].backward_input, 1.5 + 0.0625 + 0.125);
  // Charging twice changes nothing; one rank sends nothing.
  EXPECT_EQ(costModelToJson(v.withOverheadsCharged({0, 1, 1, 0})), costModelToJson(v));
  const CostModel alone = c.withOverheadsCharged({0, 0});
  EXPECT_DOUBLE_EQ(alone.stages[1].forward, 1 + 0.0625);
  EXPECT_DOUBLE_EQ(alone.stages[1].fullBackward(), 2 + 0.0625);
  // Without overheads the model comes back as it was (one set for all stages).
  EXPECT_EQ(CostModel::uniform(1, 1, 1).withOverheadsCharged({0, 1, 0, 1}).stages.size(), 1u);
}

TEST(CostModel, OverheadsRoundTripThroughJsonAndBadOnesAreRefused) {
  const CostModel m = costModelFromJson(nlohmann::json::parse(
      R"({"forward": 1, "backward_input": 1, "backward_weight": 1, "send_overhead": 0.2, "recv_overhead": 0.05,
          "action_overhead": 0.01})"));
  EXPECT_DOUBLE_EQ(m.send_overhead, 0.2);
  EXPECT_DOUBLE_EQ(m.recv_overhead, 0.05);
  EXPECT_DOUBLE_EQ(m.action_overhead, 0.01);
  EXPECT_EQ(costModelToJson(costModelFromJson(costModelToJson(m))), costModelToJson(m));
  EXPECT_THAT(describeCostModel(m), HasSubstr("send=0.2 recv=0.05 action=0.01"));
  try {
    costModelFromJson(nlohmann::json::parse(R"({"send_overhead": -1})"));
    FAIL() << "a negative overhead was taken";
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("send overhead is -1; expected a finite number >= 0"));
  }
}

// The simulator, the order evaluator and the lowered program all charge the
// same overheads: a schedule simulated with them equals the same schedule
// simulated on the costs charged by hand.
TEST(SimulateCost, OverheadsCostTheSameInEverySimulator) {
  CostModel c = CostModel::uniform(1, 1.3, 0.7, 0.1);
  c.send_overhead = 0.2;
  c.recv_overhead = 0.05;
  c.action_overhead = 0.01;
  for (const char* name : {"1F1B", "Interleaved1F1B", "ZBVZeroBubble", "DualPipeV"}) {
    const int spr = std::string(name) == "1F1B" ? 1 : 2;
    const Program p = generateSchedule(name, {2, spr, 6});
    const CostModel by_hand = c.withOverheadsCharged(p.stage_to_rank);
    const CostSimulation sim = simulateCost(p, c);
    EXPECT_DOUBLE_EQ(sim.makespan, simulateCost(p, by_hand).makespan) << name;
    EXPECT_GT(sim.makespan, simulateCost(p, CostModel::uniform(1, 1.3, 0.7, 0.1)).makespan) << name;
    EXPECT_DOUBLE_EQ(simulateCost(lowerForExecution(p), c).makespan,
                     simulateCost(lowerForExecution(p), by_hand).makespan)
        << name;
    if (std::string(name) == "DualPipeV") continue;  // its OVERLAP_F_B: one op per half in the evaluator
    const RankOrders orders = fromProgram(p);
    OrderEvaluator evaluator(orders, c);
    OrderEvaluation e;
    evaluator.evaluate(orders, e, false);
    EXPECT_DOUBLE_EQ(e.makespan, sim.makespan) << name;
  }
}

TEST(SimulateCost, OrderEvaluatorAgreesWithTheSimulator) {
  CostModel c = CostModel::uniform(1, 1.3, 0.7, 0.1);
  c.weight_memory_share = 0.4;
  for (const char* name : {"1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "Interleaved1F1B"}) {
    const int spr = std::string(name) == "1F1B" ? 1 : 2;
    Program p = generateSchedule(name, {4, spr, 8});
    CostSimulation sim = simulateCost(p, c);
    RankOrders orders = fromProgram(p);
    OrderEvaluator evaluator(orders, c);
    OrderEvaluation e;
    evaluator.evaluate(orders, e, true);
    EXPECT_FALSE(e.deadlocked) << name;
    EXPECT_DOUBLE_EQ(e.makespan, sim.makespan) << name;
    EXPECT_EQ(e.peak_memory, sim.peak_memory) << name;
  }
}

// Note [Cost simulation]: the OrderEvaluator must time every op exactly as
// simulateCost does (same inputs, durations, latency and memory arithmetic),
// over every named schedule, both layouts' shapes, and uniform and per-stage costs.
TEST(SimulateCost, OrderEvaluatorTimesEveryOpLikeTheSimulator) {
  CostModel uniform = CostModel::uniform(1, 1.3, 0.7, 0.1);
  uniform.weight_memory_share = 0.4;
  CostModel per_stage;
  per_stage.comm_latency = 0.25;
  per_stage.weight_memory_share = 0.3;
  int checked = 0;
  for (const std::string& name : scheduleNames()) {
    for (int ranks : {2, 4}) {
      for (int spr : {1, 2}) {
        for (int m : {4, 8}) {
          Program p;
          try {
            p = generateSchedule(name, {ranks, spr, m});
          } catch (const ScheduleError&) {
            continue;  // a shape this schedule rejects
          }
          bool overlaps = false;  // OVERLAP_F_B is one event in the simulator, two ops here
          for (const auto& row : p.actions) {
            for (const auto& cell : row) {
              overlaps = overlaps || (cell && cell->type == ActionType::kOverlapFB);
            }
          }
          if (overlaps) continue;
          per_stage.stages.clear();
          for (int s = 0; s < p.num_stages; ++s) {
            StageCost c;
            c.forward = 1.0 + 0.1 * s;
            c.backward_input = 1.5 - 0.05 * s;
            c.backward_weight = 0.5 + 0.02 * s;
            if (s % 3 == 0) c.full_backward = 1.7;
            c.activation_memory = 1.0 + 0.5 * (s % 2);
            per_stage.stages.push_back(c);
          }
          for (const CostModel* costs : {&uniform, &per_stage}) {
            const std::string where = fmt::format("{} {}x{} m={} comm={}", name, ranks, spr, m,
                                                  costs->comm_latency);
            CostSimulation sim = simulateCost(p, *costs);
            RankOrders orders = fromProgram(p);
            OrderEvaluator evaluator(orders, *costs);
            OrderEvaluation e;
            evaluator.evaluate(orders, e, true);
            ASSERT_FALSE(e.deadlocked) << where;
            EXPECT_EQ(e.makespan, sim.makespan) << where;
            EXPECT_EQ(e.peak_memory, sim.peak_memory) << where;
            // Events come by rank, then list order: the same order as the ops.
            ASSERT_EQ(sim.events.size(), orders.size()) << where;
            for (std::size_t k = 0; k < sim.events.size(); ++k) {
              EXPECT_EQ(e.start[k], sim.events[k].start) << where << " op " << k;
              EXPECT_EQ(e.end[k], sim.events[k].end) << where << " op " << k;
            }
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 40);
}

// --- known bubbles -----------------------------------------------------------------
//
// Equal costs F = I = W = 1 (B = 2), no latency. Every figure below is exact
// (the schedules are periodic and the simulator adds no noise), so the
// tolerance is only floating-point rounding.

struct Case {
  int p;
  int m;
};
const Case kGrid[] = {{2, 4}, {2, 8}, {4, 4}, {4, 8}, {4, 16}, {8, 8}, {8, 16}, {8, 32}};
constexpr double kTol = 1e-12;

double bubbleOf(const char* name, int p, int v, int m) {
  Program program = generateSchedule(name, {p, v, m});
  CostSimulation sim = simulateCost(program, CostModel::uniform(1, 1, 1));
  // Every rank idles the same here; check that too.
  for (double b : sim.bubble_fraction) EXPECT_NEAR(b, sim.totalBubbleFraction(), kTol) << name;
  return sim.totalBubbleFraction();
}

TEST(KnownBubbles, GPipeAndOneFOneB) {
  for (const Case& c : kGrid) {
    const double expected = double(c.p - 1) / (c.m + c.p - 1);
    EXPECT_NEAR(bubbleOf("GPipe", c.p, 1, c.m), expected, kTol) << c.p << "x" << c.m;
    EXPECT_NEAR(bubbleOf("1F1B", c.p, 1, c.m), expected, kTol) << c.p << "x" << c.m;
  }
}

TEST(KnownBubbles, Interleaved1F1B) {
  // (p-1)/(v*m + p-1): each of the v chunks costs 1/v of the 1F1B stage, so
  // the fill and drain shrink by v. It holds when m >= p (with m < p the
  // schedule cannot keep the ranks busy between chunks, e.g. p=8, m=4, v=2
  // gives 0.579, not 0.467).
  for (const Case& c : kGrid) {
    if (c.m < c.p) continue;
    for (int v : {2, 4}) {
      const double expected = double(c.p - 1) / (v * c.m + c.p - 1);
      EXPECT_NEAR(bubbleOf("Interleaved1F1B", c.p, v, c.m), expected, kTol)
          << c.p << "x" << c.m << " v=" << v;
    }
  }
}

TEST(KnownBubbles, ZeroBubbleOneP) {
  // ZB1P (InterleavedZeroBubble) idles (p-1)*F per rank where 1F1B idles
  // (p-1)*(F+B) = 3(p-1)*F: a third of the idle time. As a fraction of the
  // step that is (p-1)/(3*v*m + p-1) against 1F1B's (p-1)/(m + p-1), which
  // tends to a third as m grows (0.41 of it at p=4, m=8, v=1). Holds for m >= p.
  for (const Case& c : kGrid) {
    if (c.m < c.p) continue;
    for (int v : {1, 2}) {
      const double expected = double(c.p - 1) / (3 * v * c.m + c.p - 1);
      EXPECT_NEAR(bubbleOf("InterleavedZeroBubble", c.p, v, c.m), expected, kTol)
          << c.p << "x" << c.m << " v=" << v;
    }
    Program zb = generateSchedule("InterleavedZeroBubble", {c.p, 1, c.m});
    Program ob = generateSchedule("1F1B", {c.p, 1, c.m});
    CostModel equal = CostModel::uniform(1, 1, 1);
    CostSimulation zs = simulateCost(zb, equal);
    CostSimulation os = simulateCost(ob, equal);
    const double zb_idle = zs.makespan - zs.busy_time[0];
    const double ob_idle = os.makespan - os.busy_time[0];
    EXPECT_NEAR(zb_idle * 3.0, ob_idle, kTol);
  }
}

TEST(KnownBubbles, ZBVIsNearZeroOnceMicrobatchesReachTwiceTheRanks) {
  // With m >= 2p the only idle time left is the fill of the first F: each rank
  // waits (p-1)*F in total, out of 6m units of work (2 chunks x F,I,W), so the
  // bubble is (p-1)/(6m + p-1): 0.059 at p=4, m=8 and 0.015 at p=4, m=32.
  for (const Case& c : kGrid) {
    if (c.m < 2 * c.p) continue;
    const double expected = double(c.p - 1) / (6 * c.m + c.p - 1);
    EXPECT_NEAR(bubbleOf("ZBVZeroBubble", c.p, 2, c.m), expected, kTol) << c.p << "x" << c.m;
  }
  EXPECT_LT(bubbleOf("ZBVZeroBubble", 4, 2, 32), 0.016);
}

}  // namespace
}  // namespace pipeforge::schedules
