#include "runtime/pair_order.h"

#include <gtest/gtest.h>
#include <fmt/format.h>

#include <set>
#include <tuple>

#include "runtime/comm_plan.h"
#include "schedules/generate.h"
#include "schedules/lower.h"

namespace pipeforge::runtime {
namespace {

using stage::ValueSource;

// `n` stages in a chain; with `skips`, stage s also reads output 1 of stage
// s-2 (a skip over one stage, as multi_io's).
CommPlan chainPlan(int n, bool skips) {
  stage::PipeManifest m;
  m.num_stages = n;
  m.inputs = {"x"};
  for (int s = 0; s < n; ++s) {
    stage::StageInfo info;
    info.index = s;
    info.file = fmt::format("stage_{}.pt", s);
    if (s == 0) info.inputs.push_back(ValueSource{ValueSource::Kind::kInput, -1, 0});
    if (s > 0) info.inputs.push_back(ValueSource{ValueSource::Kind::kStage, s - 1, 0});
    if (skips && s > 1) info.inputs.push_back(ValueSource{ValueSource::Kind::kStage, s - 2, 1});
    info.num_outputs = s == n - 1 ? 1 : 2;
    m.stages.push_back(info);
  }
  m.outputs = {ValueSource{ValueSource::Kind::kStage, n - 1, 0}};
  return buildCommPlan(m);
}

schedules::Program lowered(const std::string& name, int ranks, int stages_per_rank, int mbs) {
  return schedules::lowerForExecution(schedules::generateSchedule(name, {ranks, stages_per_rank, mbs}));
}

std::string text(const std::vector<PairMessage>& order) {
  std::string out;
  for (const PairMessage& m : order) {
    out += fmt::format("{}{}{} ", m.kind == MessageKind::kValue ? 'V' : 'G', m.edge, m.mb);
  }
  return out;
}

// Note [Pair order]'s example: rank 1 receives F1 before it sends B0, as
// rank 0 sends F1 before it receives B0.
TEST(PairOrderTest, OneFOneBOnTwoRanksInterleavesValuesAndGradientsAsTheyAreMade) {
  const CommPlan plan = chainPlan(2, false);
  const schedules::Program program = lowered("1F1B", 2, 1, 4);
  const auto first = pairOrder(program, plan, 0), second = pairOrder(program, plan, 1);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(text(first.at(1)), "V00 V01 G00 V02 G01 V03 G02 G03 ");
  EXPECT_EQ(text(second.at(0)), text(first.at(1)));
}

// Both ends of every pair hold the same list, with every message of the
// step once, for every generator, with skip edges across ranks.
TEST(PairOrderTest, BothEndsOfEveryPairAgreeForEverySchedule) {
  for (const std::string& name : schedules::scheduleNames()) {
    for (int ranks : {2, 4}) {
      const int per_rank = name == "GPipe" || name == "1F1B" ? 1 : 2;
      const int mbs = 2 * ranks;
      const schedules::Program program = lowered(name, ranks, per_rank, mbs);
      const CommPlan plan = chainPlan(ranks * per_rank, true);
      std::vector<std::map<int, std::vector<PairMessage>>> orders;
      for (int r = 0; r < ranks; ++r) orders.push_back(pairOrder(program, plan, r));
      std::size_t messages = 0;
      for (int r = 0; r < ranks; ++r) {
        for (const auto& [peer, order] : orders[r]) {
          SCOPED_TRACE(fmt::format("{} on {} ranks, ranks {} and {}", name, ranks, r, peer));
          ASSERT_TRUE(orders[peer].count(r));
          EXPECT_EQ(text(order), text(orders[peer].at(r)));
          std::set<std::tuple<int, int, MessageKind>> distinct;
          for (const PairMessage& m : order) distinct.emplace(m.edge, m.mb, m.kind);
          EXPECT_EQ(distinct.size(), order.size());
          messages += order.size();
        }
      }
      // Each message is in two lists: a value and a gradient per microbatch per cross-rank edge.
      int cross = 0;
      for (const Edge& e : plan.edges) cross += program.stage_to_rank[e.producer] != program.stage_to_rank[e.consumer];
      EXPECT_EQ(messages, static_cast<std::size_t>(2 * 2 * cross * mbs)) << name << " on " << ranks << " ranks";
    }
  }
}

}  // namespace
}  // namespace pipeforge::runtime
