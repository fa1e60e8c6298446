// Per-action timings of one pipeline step on one rank, for benchmarks and
// for feeding measured costs to schedules/simulate_cost.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "schedules/action.h"

namespace pipeforge::runtime {

struct TimedStep {
  schedules::Action action;
  double start_s = 0.0;  // seconds since the step began on this rank
  double end_s = 0.0;
  double wait_s = 0.0;   // part of [start, end) spent waiting for peers
  // Activation memory (Note [Activation memory]) the action left behind
  // (negative: it released some), and the most it held above its start.
  std::int64_t memory_delta = 0;
  std::int64_t memory_peak = 0;
};

// Note [Trace slice kinds]: what a measured trace (`pipeforge train` with
// output.trace) shows on each rank's track, and what each slice covers:
//   step       the whole training step, from reading its batch to zero_grad
//              after the update; every other slice of that step lies inside it.
//   F/B/I/W/.. an action's compute only (category: the action type). What
//              the action spent on the spans below (waits, the sends it
//              posts) is cut out of it, so one action may show as several
//              slices of its name: "1F3", "wait recv 1F3 ...", "1F3", "send ...".
//   comm       a SEND/RECV action, which posts a receive, and "send 0F3 to
//              rank 1": posting the send of 0F3's output, inside 0F3 (the
//              transport may block there; the transfer then runs in the background;
//              args.bytes is what the send carries).
//   wait       blocked on a peer: "wait recv 1F3 from rank 0" (the input of
//              stage 1's forward of microbatch 3; "1F3 shape" is its shape
//              message), "wait recv 0B3 from rank 1" (the gradient for stage
//              0's backward), "wait send 0F3 to rank 1" (at the step's end,
//              until the send of 0F3's output finished).
//   all-reduce the data-parallel gradient all-reduce of a stage, and the sum
//              of tied weights' gradients across ranks.
//   check      the trainer's collectives: the gradient check (norms, non-finite
//              flags; Note [One collective per step's checks]) and the
//              parameter check after the update.
//   optimizer  gradient clipping and every local stage's optimizer step; one
//              per rank and step, none when the update was skipped.
// Time between slices inside a step (the batch, bookkeeping) is left empty.
enum class SpanKind { kSend, kWait, kAllReduce, kCheck, kOptimizer };

// The category a span has in the trace ("wait", "all-reduce", ...).
inline const char* spanKindName(SpanKind kind) {
  switch (kind) {
    case SpanKind::kSend:
      return "comm";
    case SpanKind::kWait:
      return "wait";
    case SpanKind::kAllReduce:
      return "all-reduce";
    case SpanKind::kCheck:
      return "check";
    case SpanKind::kOptimizer:
      return "optimizer";
  }
  return "?";
}

// A part of a step that is no action's compute: a send, a wait, a collective, the update.
struct TimedSpan {
  SpanKind kind = SpanKind::kWait;
  std::string name;      // "wait recv 1F3 from rank 0", "optimizer step", ...
  double start_s = 0.0;  // seconds since the step began on this rank
  double end_s = 0.0;
  std::int64_t bytes = 0;  // a send's payload (the trace's args.bytes); 0 for other spans
};

struct StepProfile {
  double step_s = 0.0;           // wall time of the whole step on this rank
  double begin_unix_s = 0.0;     // when the step began (system clock, seconds since the epoch)
  std::vector<TimedStep> steps;  // in execution order
  std::vector<TimedSpan> spans;  // waits and collectives, in execution order; inside an action's
                                 // [start, end) or between actions
  // Bytes of sent stage outputs whose storage was released before their
  // backward (Megatron's deallocate_output_tensor); counted with or without profiling.
  std::int64_t released_bytes = 0;
  // The step's peak activation memory on this rank, in bytes (Note
  // [Activation memory] in runtime/schedule_executor.cpp); measured on every step.
  std::int64_t activation_peak_bytes = 0;
};

}  // namespace pipeforge::runtime
