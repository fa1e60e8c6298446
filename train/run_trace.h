// A Chrome/Perfetto trace of a real run: the per-action times every rank
// measured (PipelineRunner::lastProfile), laid out like schedules'
// simulated traces (schedules/chrome_trace.h): one track per rank, one
// event per action, so a measured and a simulated schedule read alike; and
// around them what only a real run has: waits, collectives, the optimizer
// and the step itself (Note [Trace slice kinds] in runtime/step_profile.h).
//
// Ranks time their steps against the wall clock (system_clock), so on one
// host, or hosts kept in sync by NTP/PTP, the tracks line up.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/step_profile.h"

namespace pipeforge::train {

// One training step of one rank. Slice kinds: Note [Trace slice kinds] in
// runtime/step_profile.h.
struct RankStepProfile {
  int rank = 0;
  std::int64_t step = 0;
  double begin_unix_s = 0.0;  // when the step began, seconds since the epoch
  double step_s = 0.0;        // the whole step's wall time; 0: unknown (no step slice)
  // The pipeline's part: its times count from profile.begin_unix_s (when 0, from begin_unix_s).
  runtime::StepProfile profile;
  // The trainer's own spans (checks, optimizer), in seconds since begin_unix_s.
  std::vector<runtime::TimedSpan> phases;
};

// Records the time from its construction to its destruction as a span in
// `out`, counted from `origin`; records nothing when `out` is null.
class SpanTimer {
 public:
  using Clock = std::chrono::steady_clock;
  SpanTimer(std::vector<runtime::TimedSpan>* out, runtime::SpanKind kind, std::string name, Clock::time_point origin)
      : out_(out), kind_(kind), name_(std::move(name)), origin_(origin), start_(Clock::now()) {}
  ~SpanTimer() {
    if (out_ == nullptr) return;
    out_->push_back(runtime::TimedSpan{kind_, std::move(name_), seconds(start_), seconds(Clock::now())});
  }
  SpanTimer(const SpanTimer&) = delete;
  SpanTimer& operator=(const SpanTimer&) = delete;

 private:
  double seconds(Clock::time_point t) const { return std::chrono::duration<double>(t - origin_).count(); }

  std::vector<runtime::TimedSpan>* out_;
  runtime::SpanKind kind_;
  std::string name_;
  Clock::time_point origin_;
  Clock::time_point start_;
};

// Plain JSON (actions in their text form) so profiles can travel between ranks.
nlohmann::json profileToJson(const RankStepProfile& profile);
RankStepProfile profileFromJson(const nlohmann::json& json);

// The trace of every profile given, times relative to the earliest step
// start: compute slices with the spans inside them cut out, the spans, and
// a step slice around each step. `otherData` adds the steps covered and
// measured: true; its bubble fraction counts compute slices as busy.
std::string measuredTraceText(const std::vector<RankStepProfile>& profiles, int world_size);

// Seconds since the epoch, now.
double unixSeconds();

}  // namespace pipeforge::train
