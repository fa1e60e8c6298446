#include "train/run_trace.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "schedules/chrome_trace.h"
#include "schedules/simulate_cost.h"

namespace pipeforge::train {

namespace {

nlohmann::json spansToJson(const std::vector<runtime::TimedSpan>& spans) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& s : spans) out.push_back({runtime::spanKindName(s.kind), s.name, s.start_s, s.end_s, s.bytes});
  return out;
}

runtime::SpanKind parseSpanKind(const std::string& text) {
  using runtime::SpanKind;
  for (auto kind : {SpanKind::kSend, SpanKind::kWait, SpanKind::kAllReduce, SpanKind::kCheck, SpanKind::kOptimizer}) {
    if (text == runtime::spanKindName(kind)) return kind;
  }
  throw std::invalid_argument(fmt::format("unknown span kind '{}'", text));
}

std::vector<runtime::TimedSpan> spansFromJson(const nlohmann::json& j) {
  std::vector<runtime::TimedSpan> out;
  for (const auto& s : j) {
    out.push_back(runtime::TimedSpan{parseSpanKind(s.at(0).get<std::string>()), s.at(1).get<std::string>(),
                                     s.at(2).get<double>(), s.at(3).get<double>(), s.at(4).get<std::int64_t>()});
  }
  return out;
}

// [start, end) less every span that overlaps it: the compute of an action
// that waited (Note [Trace slice kinds]). `spans` sorted by start.
std::vector<std::pair<double, double>> cutOut(double start, double end, const std::vector<runtime::TimedSpan>& spans) {
  std::vector<std::pair<double, double>> pieces;
  double cursor = start;
  for (const auto& s : spans) {
    if (s.end_s <= cursor || s.start_s >= end) continue;
    if (s.start_s > cursor) pieces.emplace_back(cursor, s.start_s);
    cursor = std::max(cursor, s.end_s);
  }
  if (cursor < end) pieces.emplace_back(cursor, end);
  return pieces;
}

// Rounded to a thousandth of a microsecond, as schedules/chrome_trace.cpp does.
double micros(double seconds) { return std::round(seconds * 1e9) / 1000.0; }

nlohmann::json slice(const std::string& name, const std::string& category, int rank, double start, double end,
                     std::int64_t step) {
  return {{"name", name},       {"cat", category},          {"ph", "X"},
          {"pid", 0},           {"tid", rank},              {"ts", micros(start)},
          {"dur", micros(end - start)}, {"args", {{"training_step", step}}}};
}

}  // namespace

double unixSeconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

nlohmann::json profileToJson(const RankStepProfile& p) {
  nlohmann::json actions = nlohmann::json::array();
  for (const auto& t : p.profile.steps) {
    actions.push_back({schedules::formatAction(t.action), t.start_s, t.end_s, t.wait_s});
  }
  return {{"rank", p.rank},
          {"step", p.step},
          {"begin_unix_s", p.begin_unix_s},
          {"wall_s", p.step_s},
          {"step_s", p.profile.step_s},
          {"pipeline_begin_unix_s", p.profile.begin_unix_s},
          {"actions", actions},
          {"spans", spansToJson(p.profile.spans)},
          {"phases", spansToJson(p.phases)}};
}

RankStepProfile profileFromJson(const nlohmann::json& j) {
  RankStepProfile p;
  p.rank = j.at("rank").get<int>();
  p.step = j.at("step").get<std::int64_t>();
  p.begin_unix_s = j.at("begin_unix_s").get<double>();
  p.step_s = j.at("wall_s").get<double>();
  p.profile.step_s = j.at("step_s").get<double>();
  p.profile.begin_unix_s = j.at("pipeline_begin_unix_s").get<double>();
  for (const auto& a : j.at("actions")) {
    runtime::TimedStep t;
    t.action = schedules::parseAction(a.at(0).get<std::string>());
    t.start_s = a.at(1).get<double>();
    t.end_s = a.at(2).get<double>();
    t.wait_s = a.at(3).get<double>();
    p.profile.steps.push_back(std::move(t));
  }
  p.profile.spans = spansFromJson(j.at("spans"));
  p.phases = spansFromJson(j.at("phases"));
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
  // Slices chromeTrace knows nothing of: steps, waits, collectives, the optimizer.
  std::vector<nlohmann::json> spans;
  std::int64_t first_step = std::numeric_limits<std::int64_t>::max(), last_step = -1;
  for (const RankStepProfile* p : order) {
    first_step = std::min(first_step, p->step);
    last_step = std::max(last_step, p->step);
    const double base = p->begin_unix_s - origin;
    const double pipeline = (p->profile.begin_unix_s > 0 ? p->profile.begin_unix_s : p->begin_unix_s) - origin;
    std::vector<runtime::TimedSpan> waits = p->profile.spans;
    std::stable_sort(waits.begin(), waits.end(),
                     [](const runtime::TimedSpan& a, const runtime::TimedSpan& b) { return a.start_s < b.start_s; });
    for (const auto& t : p->profile.steps) {
      const int position_of_action = position[p->rank]++;
      for (const auto& [start, end] : cutOut(t.start_s, t.end_s, waits)) {
        schedules::TimedAction e;
        e.rank = p->rank;
        e.step = position_of_action;
        e.action = t.action;
        e.start = pipeline + start;
        e.end = pipeline + end;
        sim.makespan = std::max(sim.makespan, e.end);
        if (schedules::isCompute(t.action.type)) sim.busy_time[p->rank] += end - start;
        sim.events.push_back(std::move(e));
      }
    }
    if (p->step_s > 0) {
      spans.push_back(slice(fmt::format("step {}", p->step), "step", p->rank, base, base + p->step_s, p->step));
      sim.makespan = std::max(sim.makespan, base + p->step_s);
    }
    for (const auto& s : waits) {
      spans.push_back(slice(s.name, runtime::spanKindName(s.kind), p->rank, pipeline + s.start_s,
                            pipeline + s.end_s, p->step));
      if (s.bytes > 0) spans.back()["args"]["bytes"] = s.bytes;  // a send's payload
      sim.makespan = std::max(sim.makespan, pipeline + s.end_s);
    }
    for (const auto& s : p->phases) {
      spans.push_back(
          slice(s.name, runtime::spanKindName(s.kind), p->rank, base + s.start_s, base + s.end_s, p->step));
      sim.makespan = std::max(sim.makespan, base + s.end_s);
    }
  }
  for (int r = 0; r < world_size; ++r) {
    sim.bubble_fraction[r] = sim.makespan > 0 ? (sim.makespan - sim.busy_time[r]) / sim.makespan : 0.0;
  }
  schedules::ChromeTraceOptions options;
  options.microseconds_per_unit = 1e6;  // times are in seconds
  options.process_name = "pipeforge train (measured)";
  nlohmann::json trace = schedules::chromeTrace(sim, world_size, options);
  // Metadata first, then each rank's slices by start; an enclosing slice
  // (the step) before those it encloses, so viewers nest them.
  std::vector<nlohmann::json> events;
  for (auto& e : trace["traceEvents"]) events.push_back(std::move(e));
  for (auto& s : spans) events.push_back(std::move(s));
  auto slices = std::stable_partition(events.begin(), events.end(),
                                      [](const nlohmann::json& e) { return e["ph"] == "M"; });
  auto key = [](const nlohmann::json& e) {
    return std::make_tuple(e["tid"].get<int>(), e["ts"].get<double>(), -e.value("dur", 0.0));
  };
  std::stable_sort(slices, events.end(),
                   [&](const nlohmann::json& a, const nlohmann::json& b) { return key(a) < key(b); });
  trace["traceEvents"] = std::move(events);
  trace["otherData"]["measured"] = true;
  trace["otherData"]["first_step"] = first_step;
  trace["otherData"]["last_step"] = last_step;
  return schedules::formatChromeTrace(trace);
}

}  // namespace pipeforge::train
