// `pipeline.schedule: auto`, part 2: the schedule for measured costs. The
// search is the one `pipeforge schedule --name auto` runs
// (schedules/auto_schedule.h), once per stage layout the job can take: the
// loop, and with two or more stages per rank also the V (where ZBVZeroBubble
// and DualPipeV live). Torch-free and deterministic: the same request gives
// the same program on every rank (the search's tie-breaks and its local
// search's random moves are fixed), which the trainer checks with
// programDigest.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "schedules/cost_model.h"
#include "schedules/program.h"

namespace pipeforge::train {

struct ScheduleChoiceRequest {
  int num_ranks = 1;
  int stages_per_rank = 1;
  int num_microbatches = 1;
  schedules::CostModel costs;  // one entry per stage, times in milliseconds
  // The memory a rank may use, in the unit of the costs' activation_memory
  // (bytes when measured); absent: no limit. Per layout, a rank's model
  // state is the sum of its stages' `stage_model_state`, and every rank's
  // activations get the limit less the largest rank's model state, less
  // `memory_headroom` (a share) of what remains. Without model state and
  // headroom the whole limit is for activations.
  std::optional<double> memory_limit;
  std::vector<double> stage_model_state;  // per stage, or empty (none)
  double memory_headroom = 0.0;
  // Per stage (or empty): what its actions hold for a moment above what
  // they keep (schedules' memory model counts only what is kept). A rank's
  // simulated peak adds the largest of its stages'; the search keeps the
  // kept peak under the limit less the largest of all.
  std::vector<double> stage_temporaries;
};

// How a named schedule (schedules::scheduleNames()) fares on the same costs.
struct NamedScheduleTime {
  std::string name;
  std::optional<double> makespan;  // simulated step time; absent when it cannot run this job
  std::optional<double> peak_memory;  // its simulated activation peak, max over ranks (with makespan)
  std::string note;                // why not
};

struct ScheduleChoice {
  schedules::Program program;  // compute-only
  std::string origin;          // the candidate it came from (AutoScheduleResult::origin)
  schedules::StageLayout layout = schedules::StageLayout::kLoop;
  double makespan = 0.0;       // simulated step time
  double peak_memory = 0.0;    // max over ranks, in the unit of the costs' activation_memory
  double model_state = 0.0;    // the largest rank's model state in this layout (stage_model_state)
  std::vector<double> rank_peak_memory;  // simulated peak per pipeline rank
  double lower_bound = 0.0;    // no schedule of the chosen layout can be faster
  std::vector<NamedScheduleTime> named;  // in scheduleNames() order
};

// What `pipeline.schedule: auto` chose on a real run (Note [Auto schedule] in
// train/auto_schedule_pick.h), and from which measurements.
struct AutoChoice {
  ScheduleChoice choice;
  schedules::CostModel costs;  // measured, in milliseconds
  std::uint32_t digest = 0;    // programDigest(choice.program), the same on every rank
  double model_state_bytes = 0.0;     // the chosen layout's largest rank's parameters, gradients and
                                      // optimizer state (estimated)
  std::optional<double> memory_limit; // pipeline.memory_limit, bytes per rank
};

// The fastest schedule the search finds, over the layouts above, whose
// simulated peak fits the memory limit; on equal simulated times the loop
// layout. Throws ScheduleError for a request the search rejects (sizes below
// 1, costs of another stage count), and NoScheduleFits when the limit is
// below what every layout needs.
ScheduleChoice chooseSchedule(const ScheduleChoiceRequest& request);

// The limit is below what every layout needs: its largest rank's model
// state, and the smallest activation peak it can have (one microbatch's
// activations on all of a rank's stages, schedules::minimumMemoryLimit, and
// the temporaries) with the headroom. Names the layout that needs the least.
struct NoScheduleFits : std::runtime_error {
  NoScheduleFits(double smallest_peak, schedules::StageLayout layout, double model_state, double least_limit);
  double smallest_peak;           // activations
  schedules::StageLayout layout;  // the layout that needs the least
  double model_state;             // its largest rank's
  double least_limit;             // the least memory_limit under which it fits
};

const char* layoutName(schedules::StageLayout layout);

// FNV-1a of the program's CSV and stage layout: equal programs, equal digests.
// Below 2^32, so a float64 allreduce carries it exactly.
std::uint32_t programDigest(const schedules::Program& program);

}  // namespace pipeforge::train
