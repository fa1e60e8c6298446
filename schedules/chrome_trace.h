// A simulated schedule as a Chrome trace (the JSON "Trace Event Format" that
// chrome://tracing and https://ui.perfetto.dev open): one track per rank, one
// complete ("X") event per compute action with its start and duration in
// microseconds, zero-time actions (SEND/RECV, UNSHARD, ...) as instant events.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "schedules/simulate_cost.h"

namespace pipeforge::schedules {

struct ChromeTraceOptions {
  // Microseconds per simulation time unit: 1000 reads cost-model units as
  // milliseconds (the CLI's convention) and unit-time steps as 1 ms each.
  double microseconds_per_unit = 1000.0;
  std::string process_name = "pipeforge schedule";
  // Emit zero-time actions as instant events.
  bool include_instant_actions = true;
};

// Deterministic: events sorted by rank, then start, then list position.
// `otherData` carries the makespan, per-rank bubble fraction and peak memory.
nlohmann::json chromeTrace(const CostSimulation& simulation, int num_ranks,
                           const ChromeTraceOptions& options = {});

// Serialises any trace in chromeTrace's shape: one event per line, so diffs
// stay readable (the measured traces of `pipeforge train` use it too).
std::string formatChromeTrace(const nlohmann::json& trace);

// chromeTrace, serialised by formatChromeTrace.
std::string chromeTraceText(const CostSimulation& simulation, int num_ranks,
                            const ChromeTraceOptions& options = {});

}  // namespace pipeforge::schedules
