// chooseSchedule: the search of `pipeforge schedule --name auto` over the
// layouts a job can take, deterministic for given costs, and the choice
// follows the costs (a cheap fused backward picks 1F1B, an expensive weight
// gradient a zero-bubble schedule, unbalanced stages the V layout).
#include "train/schedule_choice.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "schedules/auto_schedule.h"
#include "schedules/generate.h"
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
