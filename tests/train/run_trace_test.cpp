#include "train/run_trace.h"

#include <gtest/gtest.h>

namespace pipeforge::train {
namespace {

RankStepProfile profile(int rank, double begin, std::vector<std::pair<std::string, std::pair<double, double>>> acts) {
  RankStepProfile p;
  p.rank = rank;
  p.step = 7;
  p.begin_unix_s = begin;
  for (const auto& [text, span] : acts) {
    p.profile.steps.push_back(runtime::TimedStep{schedules::parseAction(text), span.first, span.second, 0.0});
  }
  p.profile.step_s = 1.0;
  return p;
}

TEST(RunTrace, ProfilesRoundTripThroughJson) {
  auto p = profile(1, 100.5, {{"1F0", {0.0, 0.25}}, {"1SEND_F0", {0.25, 0.26}}});
  auto back = profileFromJson(nlohmann::json::parse(profileToJson(p).dump()));
  EXPECT_EQ(back.rank, 1);
  EXPECT_EQ(back.step, 7);
  ASSERT_EQ(back.profile.steps.size(), 2u);
  EXPECT_EQ(back.profile.steps[1].action, schedules::parseAction("1SEND_F0"));
  EXPECT_DOUBLE_EQ(back.profile.steps[0].end_s, 0.25);
}

TEST(RunTrace, OneTrackPerRankInMicroseconds) {
  std::vector<RankStepProfile> all = {profile(0, 10.0, {{"0F0", {0.0, 0.5}}}),
                                      profile(1, 10.25, {{"1F0", {0.0, 0.5}}})};
  auto trace = nlohmann::json::parse(measuredTraceText(all, 2));
  int compute = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    ++compute;
    if (e["name"] == "1F0") {
      EXPECT_EQ(e["tid"], 1);
      EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 250000.0);
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 500000.0);
    }
  }
  EXPECT_EQ(compute, 2);
  EXPECT_EQ(trace["otherData"]["measured"], true);
}

}  // namespace
}  // namespace pipeforge::train
