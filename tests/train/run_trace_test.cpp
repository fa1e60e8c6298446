#include "train/run_trace.h"

#include <gtest/gtest.h>

#include <tuple>

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

TEST(RunTrace, SpansAndPhasesRoundTripThroughJson) {
  auto p = profile(1, 100.5, {{"1F0", {0.0, 0.25}}});
  p.step_s = 0.5;
  p.profile.begin_unix_s = 100.75;
  p.profile.spans.push_back({runtime::SpanKind::kWait, "wait recv 1F0 from rank 0", 0.0, 0.125});
  p.phases.push_back({runtime::SpanKind::kOptimizer, "optimizer step", 0.375, 0.5});
  auto back = profileFromJson(nlohmann::json::parse(profileToJson(p).dump()));
  EXPECT_DOUBLE_EQ(back.step_s, 0.5);
  EXPECT_DOUBLE_EQ(back.profile.begin_unix_s, 100.75);
  ASSERT_EQ(back.profile.spans.size(), 1u);
  EXPECT_EQ(back.profile.spans[0].kind, runtime::SpanKind::kWait);
  EXPECT_EQ(back.profile.spans[0].name, "wait recv 1F0 from rank 0");
  EXPECT_DOUBLE_EQ(back.profile.spans[0].end_s, 0.125);
  ASSERT_EQ(back.phases.size(), 1u);
  EXPECT_EQ(back.phases[0].kind, runtime::SpanKind::kOptimizer);
  EXPECT_DOUBLE_EQ(back.phases[0].start_s, 0.375);
}

// Note [Trace slice kinds]: a wait inside an action is cut out of its compute
// slice; the trainer's phases count from the step's start, the pipeline's
// spans from the pipeline's; the step slice encloses them and comes first.
TEST(RunTrace, WaitsAreCutOutOfComputeSlices) {
  // Step at t=10 s for 1 s; the pipeline starts 0.125 s into it. (0F0;1B0)
  // waits from 0.25 to 0.5 between its forward and its backward.
  auto p = profile(0, 10.0, {{"(0F0;1B0)OVERLAP_F_B", {0.125, 0.75}}});
  p.step_s = 1.0;
  p.profile.begin_unix_s = 10.125;
  p.profile.spans.push_back({runtime::SpanKind::kWait, "wait recv 1B0 from rank 1", 0.25, 0.5});
  p.phases.push_back({runtime::SpanKind::kOptimizer, "optimizer step", 0.875, 0.9375});
  auto trace = nlohmann::json::parse(measuredTraceText({p}, 1));
  std::vector<std::tuple<std::string, std::string, double, double>> got;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M") continue;
    EXPECT_EQ(e["ph"], "X");
    got.emplace_back(e["name"].get<std::string>(), e["cat"].get<std::string>(), e["ts"].get<double>(),
                     e["dur"].get<double>());
  }
  const std::vector<std::tuple<std::string, std::string, double, double>> want = {
      {"step 7", "step", 0.0, 1e6},
      {"(0F0;1B0)OVERLAP_F_B", "OVERLAP_F_B", 250000.0, 125000.0},
      {"wait recv 1B0 from rank 1", "wait", 375000.0, 250000.0},
      {"(0F0;1B0)OVERLAP_F_B", "OVERLAP_F_B", 625000.0, 250000.0},
      {"optimizer step", "optimizer", 875000.0, 62500.0}};
  EXPECT_EQ(got, want);
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
