#include "train/run_trace.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <tuple>

#include "schedules/chrome_trace.h"
#include "schedules/simulate_cost.h"

namespace pipeforge::train {

double unixSeconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

nlohmann::json profileToJson(const RankStepProfile& p) {
  nlohmann::json actions = nlohmann::json::array();
  for (const auto& t : p.profile.steps) {
    actions.push_back({schedules::formatAction(t.action), t.start_s, t.end_s, t.wait_s});
  }
  return {{"rank", p.rank}, {"step", p.step}, {"begin_unix_s", p.begin_unix_s}, {"step_s", p.profile.step_s},
          {"actions", actions}};
}

RankStepProfile profileFromJson(const nlohmann::json& j) {
  RankStepProfile p;
  p.rank = j.at("rank").get<int>();
  p.step = j.at("step").get<std::int64_t>();
  p.begin_unix_s = j.at("begin_unix_s").get<double>();
  p.profile.step_s = j.at("step_s").get<double>();
  for (const auto& a : j.at("actions")) {
    runtime::TimedStep t;
    t.action = schedules::parseAction(a.at(0).get<std::string>());
    t.start_s = a.at(1).get<double>();
    t.end_s = a.at(2).get<double>();
    t.wait_s = a.at(3).get<double>();
    p.profile.steps.push_back(std::move(t));
  }
  return p;
}

std::string measuredTraceText(const std::vector<RankStepProfile>& profiles, int world_size) {
  double origin = std::numeric_limits<double>::infinity();
  for (const auto& p : profiles) origin = std::min(origin, p.begin_unix_s);
  schedules::CostSimulation sim;
  sim.busy_time.assign(world_size, 0.0);
  sim.bubble_fraction.assign(world_size, 0.0);
  sim.peak_memory.assign(world_size, 0.0);
  std::vector<int> position(world_size, 0);
  std::vector<const RankStepProfile*> order;
  for (const auto& p : profiles) order.push_back(&p);
  std::stable_sort(order.begin(), order.end(), [](const RankStepProfile* a, const RankStepProfile* b) {
    return std::tie(a->rank, a->step) < std::tie(b->rank, b->step);
  });
  std::int64_t first_step = std::numeric_limits<std::int64_t>::max(), last_step = -1;
  for (const RankStepProfile* p : order) {
    first_step = std::min(first_step, p->step);
    last_step = std::max(last_step, p->step);
    const double base = p->begin_unix_s - origin;
    for (const auto& t : p->profile.steps) {
      schedules::TimedAction e;
      e.rank = p->rank;
      e.step = position[p->rank]++;
      e.action = t.action;
      e.start = base + t.start_s;
      e.end = base + t.end_s;
      sim.makespan = std::max(sim.makespan, e.end);
      if (schedules::isCompute(t.action.type)) sim.busy_time[p->rank] += t.end_s - t.start_s;
      sim.events.push_back(std::move(e));
    }
  }
  for (int r = 0; r < world_size; ++r) {
    sim.bubble_fraction[r] = sim.makespan > 0 ? (sim.makespan - sim.busy_time[r]) / sim.makespan : 0.0;
  }
  schedules::ChromeTraceOptions options;
  options.microseconds_per_unit = 1e6;  // times are in seconds
  options.process_name = "pipeforge train (measured)";
  nlohmann::json trace = schedules::chromeTrace(sim, world_size, options);
  trace["otherData"]["measured"] = true;
  trace["otherData"]["first_step"] = first_step;
  trace["otherData"]["last_step"] = last_step;
  return schedules::formatChromeTrace(trace);
}

}  // namespace pipeforge::train
