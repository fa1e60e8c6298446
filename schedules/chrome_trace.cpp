#include "schedules/chrome_trace.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include <fmt/format.h>

namespace pipeforge::schedules {

namespace {

// Rounded to a thousandth of a microsecond so equal inputs print equally.
double micros(double units, double scale) { return std::round(units * scale * 1000.0) / 1000.0; }

std::string category(const Action& action) {
  switch (action.type) {
    case ActionType::kForward:
    case ActionType::kBackwardInput:
    case ActionType::kBackwardWeight:
    case ActionType::kFullBackward:
    case ActionType::kOverlapFB:
      return std::string(actionTypeName(action.type));
    case ActionType::kSendF:
    case ActionType::kRecvF:
    case ActionType::kSendB:
    case ActionType::kRecvB:
      return "comm";
    case ActionType::kUnshard:
    case ActionType::kReshard:
    case ActionType::kReduceGrad:
      return "sharding";
  }
  unknownActionType(action.type);
}

nlohmann::json actionArgs(const TimedAction& e) {
  nlohmann::json args = {{"step", e.step}};
  if (e.action.type == ActionType::kOverlapFB) {
    nlohmann::json parts = nlohmann::json::array();
    for (const Action& sub : e.action.sub_actions) parts.push_back(formatAction(sub));
    args["overlaps"] = parts;
  } else {
    args["stage"] = e.action.stage;
    if (e.action.microbatch) args["microbatch"] = *e.action.microbatch;
  }
  return args;
}

}  // namespace

nlohmann::json chromeTrace(const CostSimulation& simulation, int num_ranks,
                           const ChromeTraceOptions& options) {
  if (num_ranks < 1) {
    throw ScheduleError(fmt::format("chrome trace: {} ranks; need at least 1", num_ranks));
  }
  if (!(options.microseconds_per_unit > 0.0) || !std::isfinite(options.microseconds_per_unit)) {
    throw ScheduleError(fmt::format(
        "chrome trace: microseconds_per_unit is {}; expected a positive number",
        options.microseconds_per_unit));
  }
  const double scale = options.microseconds_per_unit;
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"ph", "M"},
                    {"name", "process_name"},
                    {"pid", 0},
                    {"tid", 0},
                    {"args", {{"name", options.process_name}}}});
  for (int r = 0; r < num_ranks; ++r) {
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", 0},
                      {"tid", r},
                      {"args", {{"name", fmt::format("rank {}", r)}}}});
    events.push_back({{"ph", "M"},
                      {"name", "thread_sort_index"},
                      {"pid", 0},
                      {"tid", r},
                      {"args", {{"sort_index", r}}}});
  }
  std::vector<const TimedAction*> order;
  order.reserve(simulation.events.size());
  for (const TimedAction& e : simulation.events) {
    if (e.rank < 0 || e.rank >= num_ranks) {
      throw ScheduleError(fmt::format(
          "chrome trace: an event runs on rank {}, but the trace has ranks 0..{}", e.rank,
          num_ranks - 1));
    }
    order.push_back(&e);
  }
  std::stable_sort(order.begin(), order.end(), [](const TimedAction* a, const TimedAction* b) {
    return std::tie(a->rank, a->start, a->step) < std::tie(b->rank, b->start, b->step);
  });
  for (const TimedAction* e : order) {
    const bool timed = e->end > e->start;
    if (!timed && !options.include_instant_actions) continue;
    nlohmann::json event = {{"name", formatAction(e->action)},
                            {"cat", category(e->action)},
                            {"ph", timed ? "X" : "i"},
                            {"pid", 0},
                            {"tid", e->rank},
                            {"ts", micros(e->start, scale)}};
    if (timed) {
      event["dur"] = micros(e->end - e->start, scale);
    } else {
      event["s"] = "t";  // an instant on this rank's track
    }
    event["args"] = actionArgs(*e);
    events.push_back(std::move(event));
  }
  nlohmann::json trace;
  trace["traceEvents"] = std::move(events);
  trace["displayTimeUnit"] = "ms";
  trace["otherData"] = {{"makespan_us", micros(simulation.makespan, scale)},
                        {"bubble_fraction", simulation.bubble_fraction},
                        {"peak_memory", simulation.peak_memory},
                        {"microseconds_per_unit", scale}};
  return trace;
}

std::string chromeTraceText(const CostSimulation& simulation, int num_ranks,
                            const ChromeTraceOptions& options) {
  return formatChromeTrace(chromeTrace(simulation, num_ranks, options));
}

std::string formatChromeTrace(const nlohmann::json& trace) {
  std::string out = "{\"traceEvents\": [\n";
  const auto& events = trace["traceEvents"];
  for (std::size_t k = 0; k < events.size(); ++k) {
    out += "  " + events[k].dump();
    out += k + 1 < events.size() ? ",\n" : "\n";
  }
  out += "],\n\"displayTimeUnit\": \"ms\",\n\"otherData\": " + trace["otherData"].dump() + "}\n";
  return out;
}

}  // namespace pipeforge::schedules
