// `pipeline.schedule: auto`, part 1: measures what each stage's F, I, W and
// B cost on the real model, as a schedules::CostModel for the search
// (train/schedule_choice.h). Torch-free: it builds programs and reads
// runtime::StepProfile timings; the trainer runs the steps.
#pragma once

#include <vector>

#include "runtime/step_profile.h"
#include "schedules/cost_model.h"
#include "schedules/program.h"

namespace pipeforge::train {

// Note [Profiling order]: the profiling program runs one microbatch at a
// time through the whole pipeline (every F of the microbatch in stage order,
// its backward in reverse stage order), stages in the loop layout. Only one
// microbatch's activations are ever alive, so profiling needs no more memory
// than any schedule, and no two ranks compute at once, so on a shared host
// their timings do not disturb each other. Even microbatches run the backward
// whole (B), odd ones split (every I of the microbatch, then every W), so one
// step times all four kinds of action (m = 1 times no I or W). The program
// comes back lowered (SEND/RECV added) without merging I and W into B, which
// lowerForExecution would do where they are adjacent. With one pipeline rank
// nothing is sent, so the runner lowers it again, which merges a stage's I
// and W where they follow each other (one stage per rank): such runs time no
// I or W either (costModelFromTimes then splits B in halves).
//
//   2 ranks, 2 stages each (0, 2 on rank 0; 1, 3 on rank 1), before lowering:
//     rank 0: 0F0 2F0 2B0 0B0 0F1 2F1 2I1 0I1 2W1 0W1 0F2 2F2 2B2 0B2 ...
//     rank 1: 1F0 3F0 3B0 1B0 1F1 3F1 3I1 1I1 3W1 1W1 1F2 3F2 3B2 1B2 ...
schedules::Program profilingProgram(int num_ranks, int stages_per_rank, int num_microbatches);

// The kinds of action timed, in the order of a stage's entries below.
enum class TimedKind { kForward = 0, kBackwardInput = 1, kBackwardWeight = 2, kFullBackward = 3 };
inline constexpr int kTimedKinds = 4;

// One rank's measurements: for each stage and kind, the median compute time
// (the action's wall time less its waits for peers) in milliseconds over
// every such action in `profiles`, at [stage * kTimedKinds + kind]; 0 where
// the rank ran none (stages it does not hold). Medians, so the first calls
// of a fresh module (TorchScript optimizes on them) do not count.
// Posting a send inside an action (its "send ... to rank" span) is cut out
// of it: medianOverheads counts it, for the boundaries that cross ranks.
std::vector<double> medianActionTimes(const std::vector<runtime::StepProfile>& profiles, int num_stages);

// One rank's overheads (Note [Action overheads] in schedules/cost_model.h),
// in milliseconds, from the same profiles: the median send posting, the
// median RECV less its wait, and per F, I, W or B the step's time outside
// every action and every span between actions (the runtime's bookkeeping),
// the median over steps. Zero where the rank had none (one rank sends nothing).
struct ActionOverheads {
  double send_ms = 0.0;
  double recv_ms = 0.0;
  double action_ms = 0.0;
};
ActionOverheads medianOverheads(const std::vector<runtime::StepProfile>& profiles);

// The cost model of per-stage times laid out as medianActionTimes lays them
// out, after the ranks summed theirs (each stage measured by one rank).
// Stages without I or W times take half of B for each, stages without B
// take I + W; every time is at least kMinActionMs (the search needs positive
// durations). No communication latency (the times exclude waits) and one
// unit of activation memory per microbatch and stage, as `pipeforge schedule`
// assumes without --act-mem.
schedules::CostModel costModelFromTimes(const std::vector<double>& times, int num_stages);

// One rank's activation memory per stage, in bytes, from the same profiles
// (Note [Activation memory] in runtime/schedule_executor.cpp), laid out as
// medianActionTimes lays out times: for kForward what the forward keeps
// until its backward (the change over its RECV_F and F: the received inputs
// and what autograd saved), for kBackwardInput, kBackwardWeight and
// kFullBackward what they release (the change over RECV_B and I, over W,
// over RECV_B and B, negated). Medians over the microbatches, so the first
// backward, which also makes the gradients, counts no more than another.
// Then one entry per stage: the most any of its actions held above both
// its start and its end (temporaries: a softmax's output inside the loss,
// the gradients in flight inside a backward), the largest median over kinds.
std::vector<double> medianActionMemory(const std::vector<runtime::StepProfile>& profiles, int num_stages);

// The per-stage temporaries at the end of medianActionMemory's layout.
std::vector<double> stageTemporaries(const std::vector<double>& memory, int num_stages);

// costModelFromTimes, with each stage's activation_memory the bytes its
// forward keeps (`memory`, laid out as medianActionMemory returns it, summed
// over the ranks) and its weight_memory_share what W releases over that
// (absent where no I or W was measured; above 1 where I allocates).
schedules::CostModel costModelFromMeasurements(const std::vector<double>& times, const std::vector<double>& memory,
                                               int num_stages);

inline constexpr double kMinActionMs = 1e-3;

}  // namespace pipeforge::train
