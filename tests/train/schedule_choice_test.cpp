// chooseSchedule: the search of `pipeforge schedule --name auto` over the
// layouts a job can take, deterministic for given costs, and the choice
// follows the costs (a cheap fused backward picks 1F1B, an expensive weight
// gradient a zero-bubble schedule, unbalanced stages the V layout).
#include "train/schedule_choice.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "schedules/auto_schedule.h"
#include "schedules/errors.h"
#include "schedules/generate.h"
#include "schedules/simulate_cost.h"
#include "schedules/validate.h"

namespace pipeforge::train {
namespace {

namespace sch = pipeforge::schedules;

// F, I, W and the fused B of one stage.
sch::StageCost stageCost(double f, double i, double w, double b) {
  sch::StageCost c;
  c.forward = f;
  c.backward_input = i;
  c.backward_weight = w;
  c.full_backward = b;
  return c;
}

ScheduleChoiceRequest request(int ranks, int per_rank, int microbatches, std::vector<sch::StageCost> stages) {
  ScheduleChoiceRequest r;
  r.num_ranks = ranks;
  r.stages_per_rank = per_rank;
  r.num_microbatches = microbatches;
  r.costs.stages = std::move(stages);
  return r;
}

sch::Program named(const char* name, int ranks, int per_rank, int microbatches) {
  sch::ScheduleConfig c;
  c.num_ranks = ranks;
  c.stages_per_rank = per_rank;
  c.num_microbatches = microbatches;
  return sch::generateSchedule(name, c);
}

bool usesSplitBackward(const sch::Program& p) {
  for (const auto& row : p.actions) {
    for (const auto& a : row) {
      if (a && (a->type == sch::ActionType::kBackwardInput || a->type == sch::ActionType::kBackwardWeight)) return true;
    }
  }
  return false;
}

const NamedScheduleTime& namedTime(const ScheduleChoice& c, const std::string& name) {
  auto it = std::find_if(c.named.begin(), c.named.end(), [&](const NamedScheduleTime& n) { return n.name == name; });
  EXPECT_NE(it, c.named.end()) << name;
  return *it;
}

TEST(ChooseSchedule, ReturnsWhatTheSearchFindsAndIsDeterministic) {
  const ScheduleChoiceRequest r = request(2, 1, 4, {stageCost(1, 1, 1, 1.6), stageCost(1.2, 1, 1.1, 1.9)});
  sch::AutoScheduleConfig config;
  config.num_ranks = 2;
  config.stages_per_rank = 1;
  config.num_microbatches = 4;
  config.costs = r.costs;
  const sch::AutoScheduleResult search = sch::autoSchedule(config);

  const ScheduleChoice first = chooseSchedule(r);
  const ScheduleChoice again = chooseSchedule(r);
  EXPECT_EQ(first.program, search.program);
  EXPECT_EQ(first.origin, search.origin);
  EXPECT_EQ(first.layout, sch::StageLayout::kLoop);  // one stage per rank: the loop only
  EXPECT_DOUBLE_EQ(first.makespan, search.simulation.makespan);
  EXPECT_EQ(again.program, first.program);
  EXPECT_EQ(programDigest(again.program), programDigest(first.program));
  EXPECT_NO_THROW(sch::validateProgram(first.program));
  // Every named schedule is listed, with a time where it runs this job.
  ASSERT_EQ(first.named.size(), sch::scheduleNames().size());
  ASSERT_TRUE(namedTime(first, "1F1B").makespan.has_value());
  EXPECT_GE(*namedTime(first, "1F1B").makespan, first.makespan - 1e-9);
  EXPECT_FALSE(namedTime(first, "ZBVZeroBubble").makespan.has_value());
  EXPECT_FALSE(namedTime(first, "ZBVZeroBubble").note.empty());
}

TEST(ChooseSchedule, CheapFusedBackwardPicks1F1B) {
  // B = 1.2 where I + W = 2: splitting the backward only costs time.
  const ScheduleChoice c = chooseSchedule(request(2, 1, 4, {stageCost(1, 1, 1, 1.2)}));
  EXPECT_EQ(c.origin, "1F1B");
  EXPECT_EQ(c.program, named("1F1B", 2, 1, 4));
  EXPECT_FALSE(usesSplitBackward(c.program));
  EXPECT_DOUBLE_EQ(c.makespan, 11.0);  // 4 F + 4 B per rank, plus the warm-up and drain steps
}

TEST(ChooseSchedule, ExpensiveWeightGradientPicksZeroBubble) {
  // W = 3 (B = I + W = 4): the weight gradients fill the bubbles of 1F1B.
  const ScheduleChoice c = chooseSchedule(request(2, 1, 4, {stageCost(1, 1, 3, 4)}));
  EXPECT_EQ(c.origin, "InterleavedZeroBubble");
  EXPECT_EQ(c.program, named("InterleavedZeroBubble", 2, 1, 4));
  EXPECT_TRUE(usesSplitBackward(c.program));
  EXPECT_DOUBLE_EQ(c.makespan, 21.0);
  ASSERT_TRUE(namedTime(c, "1F1B").makespan.has_value());
  EXPECT_GT(*namedTime(c, "1F1B").makespan, c.makespan + 1.0);
}

TEST(ChooseSchedule, UnbalancedStagesPickTheVLayout) {
  // Stages 0 and 2 cost twice 1 and 3: the loop puts both heavy ones on rank
  // 0, the V (0,3 | 1,2) gives each rank one.
  const ScheduleChoice c = chooseSchedule(request(
      2, 2, 4, {stageCost(2, 2, 2, 4), stageCost(1, 1, 1, 2), stageCost(2, 2, 2, 4), stageCost(1, 1, 1, 2)}));
  EXPECT_EQ(c.layout, sch::StageLayout::kV);
  EXPECT_EQ(c.program.stage_to_rank, (std::vector<int>{0, 1, 1, 0}));
  EXPECT_DOUBLE_EQ(c.makespan, 38.0);
  ASSERT_TRUE(namedTime(c, "ZBVZeroBubble").makespan.has_value());  // timed in the V search
  ASSERT_TRUE(namedTime(c, "Interleaved1F1B").makespan.has_value());  // timed in the loop search
  EXPECT_DOUBLE_EQ(*namedTime(c, "Interleaved1F1B").makespan, 48.0);
  EXPECT_EQ(chooseSchedule(request(2, 2, 4, {stageCost(2, 2, 2, 4), stageCost(1, 1, 1, 2), stageCost(2, 2, 2, 4),
                                             stageCost(1, 1, 1, 2)}))
                .program,
            c.program);
}

// Note [Action overheads]: with messages that cost their ranks, the V, whose
// middle boundary stays on one rank, sends a third fewer than the loop, and
// auto's pick is never slower, on the same charged costs, than any named
// schedule it could have run instead.
TEST(ChooseSchedule, MessageOverheadsPickTheLayoutThatSendsFewer) {
  ScheduleChoiceRequest r = request(2, 2, 8, {stageCost(1, 1, 1, 2)});
  r.costs.send_overhead = 0.3;
  r.costs.recv_overhead = 0.1;
  r.costs.action_overhead = 0.02;
  const ScheduleChoice c = chooseSchedule(r);
  EXPECT_EQ(c.layout, sch::StageLayout::kV);
  EXPECT_DOUBLE_EQ(c.makespan, sch::simulateCost(c.program, r.costs).makespan);
  for (const NamedScheduleTime& n : c.named) {
    if (n.makespan) EXPECT_LE(c.makespan, *n.makespan + 1e-9) << n.name;
  }
  // The named schedules were timed with the overheads too.
  const sch::Program interleaved = named("Interleaved1F1B", 2, 2, 8);
  EXPECT_DOUBLE_EQ(*namedTime(c, "Interleaved1F1B").makespan, sch::simulateCost(interleaved, r.costs).makespan);
  EXPECT_GT(*namedTime(c, "Interleaved1F1B").makespan,
            sch::simulateCost(interleaved, request(2, 2, 8, {stageCost(1, 1, 1, 2)}).costs).makespan);
}

// Expensive weight gradients make a zero-bubble schedule the fastest, and
// the fastest keeps the most activations alive; a limit under its peak must
// give a slower schedule whose simulated peak fits, checked here by
// simulating the chosen program again.
TEST(ChooseSchedule, AMemoryLimitRulesOutTheFastest) {
  std::vector<sch::StageCost> stages(4, stageCost(1, 1, 2, 3));
  for (sch::StageCost& c : stages) {
    c.activation_memory = 1000;  // bytes, as measured
    c.weight_memory_share = 0.4;
  }
  ScheduleChoiceRequest r = request(2, 2, 8, stages);
  const ScheduleChoice free = chooseSchedule(r);
  ASSERT_GT(free.peak_memory, 0.0);
  const double smallest = 2 * 1000.0;  // one microbatch on both of a rank's stages
  r.memory_limit = std::max(smallest, free.peak_memory - 1000.0);
  ASSERT_LT(*r.memory_limit, free.peak_memory);
  const ScheduleChoice limited = chooseSchedule(r);
  EXPECT_LE(limited.peak_memory, *r.memory_limit + 1e-9);
  EXPECT_GE(limited.makespan, free.makespan);
  EXPECT_NE(programDigest(limited.program), programDigest(free.program));
  const sch::CostSimulation again = sch::simulateCost(limited.program, r.costs);
  EXPECT_LE(*std::max_element(again.peak_memory.begin(), again.peak_memory.end()), *r.memory_limit + 1e-9);
  ASSERT_EQ(limited.rank_peak_memory.size(), 2u);
  EXPECT_DOUBLE_EQ(*std::max_element(limited.rank_peak_memory.begin(), limited.rank_peak_memory.end()),
                   limited.peak_memory);
  // The named schedules that exceed the limit are listed without a time, saying why.
  for (const NamedScheduleTime& n : limited.named) {
    if (n.makespan) EXPECT_LE(*n.peak_memory, *r.memory_limit + 1e-9) << n.name;
  }
}

TEST(ChooseSchedule, ALimitBelowOneMicrobatchPerStageFitsNothing) {
  std::vector<sch::StageCost> stages(4, stageCost(1, 1, 1, 2));
  for (std::size_t s = 0; s < stages.size(); ++s) stages[s].activation_memory = 100.0 * static_cast<double>(s + 1);
  ScheduleChoiceRequest r = request(2, 2, 4, stages);
  r.memory_limit = 400.0;
  // Loop: rank 0 holds stages 0 and 2 (100 + 300), rank 1 stages 1 and 3
  // (200 + 400): 600. V: rank 0 holds 0 and 3 (500), rank 1 holds 1 and 2 (500).
  try {
    chooseSchedule(r);
    FAIL() << "a limit of 400 fits no layout";
  } catch (const NoScheduleFits& e) {
    EXPECT_DOUBLE_EQ(e.smallest_peak, 500.0);
    EXPECT_EQ(e.layout, sch::StageLayout::kV);
  }
  r.memory_limit = -10.0;  // a limit the model state alone exceeds
  EXPECT_THROW(chooseSchedule(r), NoScheduleFits);
  r.stage_temporaries = {0, 0, 0, 60};  // stage 3's actions hold 60 more for a moment
  r.memory_limit = 550.0;  // 500 + 60 would fit only at 560
  EXPECT_THROW(chooseSchedule(r), NoScheduleFits);
  r.stage_temporaries.clear();
  r.memory_limit = 550.0;  // the V fits, the loop does not
  const ScheduleChoice v = chooseSchedule(r);
  EXPECT_EQ(v.layout, sch::StageLayout::kV);
  EXPECT_LE(v.peak_memory, 550.0 + 1e-9);
}

// Note [Memory-aware auto]: each layout takes its own ranks' model state off
// the limit, the sum of their stages'. Stages 0 and 2 carry 300 each: the
// loop puts both on rank 0 (600), the V one on each rank (300).
TEST(ChooseSchedule, EachLayoutTakesItsOwnModelStateOffTheLimit) {
  std::vector<sch::StageCost> stages(4, stageCost(1, 1, 1, 2));
  for (sch::StageCost& c : stages) c.activation_memory = 100.0;
  ScheduleChoiceRequest r = request(2, 2, 4, stages);
  r.stage_model_state = {300, 0, 300, 0};
  r.memory_limit = 550.0;  // loop: 600 of state alone; V: 250 left, one microbatch per stage takes 200
  const ScheduleChoice v = chooseSchedule(r);
  EXPECT_EQ(v.layout, sch::StageLayout::kV);
  EXPECT_DOUBLE_EQ(v.model_state, 300.0);
  EXPECT_LE(v.peak_memory, 250.0 + 1e-9);

  r.stage_model_state = {300, 0, 0, 300};  // now the V holds both on rank 0, the loop one per rank
  const ScheduleChoice loop = chooseSchedule(r);
  EXPECT_EQ(loop.layout, sch::StageLayout::kLoop);
  EXPECT_DOUBLE_EQ(loop.model_state, 300.0);
  EXPECT_LE(loop.peak_memory, 250.0 + 1e-9);

  // With headroom, what is left shrinks by its share: 250 * 0.8 = 200 still fits one microbatch per stage.
  r.memory_headroom = 0.2;
  EXPECT_LE(chooseSchedule(r).peak_memory, 200.0 + 1e-9);
  r.memory_headroom = 0.5;  // 125 left: nothing fits; the loop needs 300 + 200 / 0.5 = 700, the V 600 + 400
  try {
    chooseSchedule(r);
    FAIL() << "no layout fits 550 with half of what is left kept free";
  } catch (const NoScheduleFits& e) {
    EXPECT_EQ(e.layout, sch::StageLayout::kLoop);
    EXPECT_DOUBLE_EQ(e.model_state, 300.0);
    EXPECT_DOUBLE_EQ(e.smallest_peak, 200.0);
    EXPECT_DOUBLE_EQ(e.least_limit, 700.0);
  }
  r.memory_limit = 700.0;  // exactly the least limit the refusal named
  EXPECT_EQ(chooseSchedule(r).layout, sch::StageLayout::kLoop);

  r.stage_model_state = {1, 2, 3};  // not one per stage
  EXPECT_THROW(chooseSchedule(r), sch::ScheduleError);
}

TEST(ChooseSchedule, DigestsTellProgramsApart) {
  const sch::Program a = named("1F1B", 2, 1, 4);
  const sch::Program b = named("GPipe", 2, 1, 4);
  EXPECT_EQ(programDigest(a), programDigest(named("1F1B", 2, 1, 4)));
  EXPECT_NE(programDigest(a), programDigest(b));
  // Same rows, other layout: another program.
  const sch::Program zbv = named("ZBVZeroBubble", 2, 2, 4);
  sch::Program relaid = zbv;
  relaid.stage_to_rank = {0, 1, 0, 1};
  EXPECT_NE(programDigest(zbv), programDigest(relaid));
}

}  // namespace
}  // namespace pipeforge::train
