// What the executor's parts record while a step runs: the spans of the
// step's profile (Note [Trace slice kinds]), when profiling, and the time the
// current action has spent waiting for peers.
#pragma once

#include <chrono>
#include <string>
#include <utility>

#include "runtime/step_profile.h"

namespace pipeforge::runtime {

using StepClock = std::chrono::steady_clock;

inline double secondsBetween(StepClock::time_point a, StepClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

class StepTrace {
 public:
  // Starts a step at `start`; spans go to `profile`, or nowhere when null.
  void begin(StepProfile* profile, StepClock::time_point start) {
    profile_ = profile;
    start_ = start;
    wait_s_ = 0.0;
  }
  bool profiling() const { return profile_ != nullptr; }

  // A span from t0 to t1, in seconds since the step began; nothing when not profiling.
  // `bytes`: what a send carries.
  void record(SpanKind kind, std::string name, StepClock::time_point t0, StepClock::time_point t1,
              std::int64_t bytes = 0) {
    if (profile_ == nullptr) return;
    profile_->spans.push_back(
        TimedSpan{kind, std::move(name), secondsBetween(start_, t0), secondsBetween(start_, t1), bytes});
  }

  // Time blocked on peers, summed until takeWaitSeconds (once per action).
  void addWait(double seconds) { wait_s_ += seconds; }
  double takeWaitSeconds() { return std::exchange(wait_s_, 0.0); }

 private:
  StepProfile* profile_ = nullptr;
  StepClock::time_point start_;
  double wait_s_ = 0.0;
};

}  // namespace pipeforge::runtime
