#include "schedules/chrome_trace.h"

#include <map>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "schedules/csv.h"
#include "schedules/generate.h"
#include "schedules/lower.h"

namespace pipeforge::schedules {
namespace {

TEST(ChromeTrace, OneTrackPerRankAndOneCompleteEventPerComputeAction) {
  Program p = generateSchedule("InterleavedZeroBubble", {2, 2, 4});
  CostSimulation sim = simulateCost(p, CostModel::uniform(1, 1.5, 0.5, 0.25));
  // Parse the text form, as Perfetto would.
  nlohmann::json trace = nlohmann::json::parse(chromeTraceText(sim, p.num_ranks));
  ASSERT_TRUE(trace.contains("traceEvents"));
  EXPECT_EQ(trace["displayTimeUnit"], "ms");
  std::set<int> named_tracks;
  std::size_t complete = 0;
  std::map<int, double> last_end;  // per track, events do not overlap
  for (const auto& e : trace["traceEvents"]) {
    ASSERT_TRUE(e.contains("ph"));
    if (e["ph"] == "M" && e["name"] == "thread_name") {
      named_tracks.insert(e["tid"].get<int>());
      EXPECT_EQ(e["args"]["name"], "rank " + std::to_string(e["tid"].get<int>()));
    }
    if (e["ph"] != "X") continue;
    ++complete;
    EXPECT_EQ(e["pid"], 0);
    const int tid = e["tid"];
    const double ts = e["ts"];
    const double dur = e["dur"];
    EXPECT_GT(dur, 0.0);
    EXPECT_GE(ts + 1e-6, last_end[tid]);
    last_end[tid] = ts + dur;
    const std::string name = e["name"];
    Action a = parseAction(name);
    EXPECT_EQ(e["cat"], std::string(actionTypeName(a.type)));
    EXPECT_EQ(e["args"]["stage"], a.stage);
    EXPECT_EQ(p.stage_to_rank[a.stage], tid);
  }
  EXPECT_EQ(named_tracks, (std::set<int>{0, 1}));
  std::size_t compute = 0;
  for (const auto& row : p.actions) {
    for (const auto& cell : row) compute += cell && isCompute(cell->type) ? 1 : 0;
  }
  EXPECT_EQ(complete, compute);
}

TEST(ChromeTrace, TimesAreMicrosecondsOfTheSimulation) {
  Program p = programFromCsv("0F0,0B0\n1F0,1B0\n");
  CostSimulation sim = simulateCost(p, CostModel::uniform(1, 1, 1, 0.5));
  nlohmann::json trace = chromeTrace(sim, 2);  // 1 unit = 1000 us
  std::map<std::string, std::pair<double, double>> seen;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X") seen[e["name"]] = {e["ts"], e["dur"]};
  }
  EXPECT_DOUBLE_EQ(seen["1F0"].first, 1500.0);
  EXPECT_DOUBLE_EQ(seen["1F0"].second, 1000.0);
  EXPECT_DOUBLE_EQ(seen["1B0"].first, 2500.0);
  EXPECT_DOUBLE_EQ(seen["1B0"].second, 2000.0);
  EXPECT_DOUBLE_EQ(seen["0B0"].first, 5000.0);
  EXPECT_DOUBLE_EQ(trace["otherData"]["makespan_us"].get<double>(), 7000.0);
  ChromeTraceOptions us;
  us.microseconds_per_unit = 1.0;
  EXPECT_DOUBLE_EQ(chromeTrace(sim, 2, us)["otherData"]["makespan_us"].get<double>(), 7.0);
}

TEST(ChromeTrace, UnitStepsWithoutCostsAndInstantCommunication) {
  Program compute = generateSchedule("1F1B", {2, 1, 3});
  Program lowered = addSendRecv(compute);
  CostSimulation sim = simulateCost(lowered, CostModel::unitSteps());
  nlohmann::json trace = chromeTrace(sim, 2);
  std::size_t instants = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "i") {
      ++instants;
      EXPECT_EQ(e["cat"], "comm");
      EXPECT_EQ(e["s"], "t");
    }
    if (e["ph"] == "X") EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 1000.0);  // one step each
  }
  EXPECT_EQ(instants, 12u);  // 3 microbatches x (SEND_F, RECV_F, SEND_B, RECV_B)
  ChromeTraceOptions quiet;
  quiet.include_instant_actions = false;
  for (const auto& e : chromeTrace(sim, 2, quiet)["traceEvents"]) EXPECT_NE(e["ph"], "i");
}

TEST(ChromeTrace, OverlapEventsListTheirHalves) {
  Program p = programFromCsv("0F0,(0F1;0B0)OVERLAP_F_B,0B1\n");
  nlohmann::json trace = chromeTrace(simulateCost(p, CostModel::uniform(1, 1, 1)), 1);
  bool found = false;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X" && e["cat"] == "OVERLAP_F_B") {
      found = true;
      EXPECT_EQ(e["args"]["overlaps"], nlohmann::json::array({"0F1", "0B0"}));
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 3000.0);
    }
  }
  EXPECT_TRUE(found);
}

TEST(ChromeTrace, DeterministicAndChecked) {
  Program p = generateSchedule("ZBVZeroBubble", {2, 2, 4});
  CostSimulation sim = simulateCost(p, CostModel::uniform(1, 1.3, 0.7, 0.1));
  EXPECT_EQ(chromeTraceText(sim, 2), chromeTraceText(simulateCost(p, CostModel::uniform(1, 1.3, 0.7, 0.1)), 2));
  EXPECT_THROW(chromeTrace(sim, 1), ScheduleError);  // events on rank 1
  ChromeTraceOptions bad;
  bad.microseconds_per_unit = 0.0;
  EXPECT_THROW(chromeTrace(sim, 2, bad), ScheduleError);
}

}  // namespace
}  // namespace pipeforge::schedules
