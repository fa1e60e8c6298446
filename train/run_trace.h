// A Chrome/Perfetto trace of a real run: the per-action times every rank
// measured (PipelineRunner::lastProfile), laid out like schedules'
// simulated traces (schedules/chrome_trace.h): one track per rank, one
// event per action, so a measured and a simulated schedule read alike.
//
// Ranks time their steps against the wall clock (system_clock), so on one
// host, or hosts kept in sync by NTP/PTP, the tracks line up.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/step_profile.h"

namespace pipeforge::train {

struct RankStepProfile {
  int rank = 0;
  std::int64_t step = 0;
  double begin_unix_s = 0.0;  // when the step began, seconds since the epoch
  runtime::StepProfile profile;
};

// Plain JSON (actions in their text form) so profiles can travel between ranks.
nlohmann::json profileToJson(const RankStepProfile& profile);
RankStepProfile profileFromJson(const nlohmann::json& json);

// The trace of every profile given, times relative to the earliest step
// start. `otherData` adds the steps covered and measured: true.
std::string measuredTraceText(const std::vector<RankStepProfile>& profiles, int world_size);

// Seconds since the epoch, now.
double unixSeconds();

}  // namespace pipeforge::train
