#include "train/schedule_choice.h"

#include <algorithm>

#include <fmt/format.h>

#include "schedules/auto_schedule.h"
#include "schedules/csv.h"
#include "schedules/errors.h"
#include "schedules/generate.h"
#include "schedules/lower.h"
#include "schedules/simulate_cost.h"

namespace pipeforge::train {
namespace {

namespace sch = pipeforge::schedules;

// autoSchedule's note for a named schedule of the other layout; it only
// decides which note is kept when neither layout can run the schedule.
constexpr const char* kOtherLayout = "places its stages in another layout";

// Each rank's largest stage temporary under `stage_to_rank`.
std::vector<double> rankTemporaries(const ScheduleChoiceRequest& request, const std::vector<int>& stage_to_rank) {
  std::vector<double> out(static_cast<std::size_t>(request.num_ranks), 0.0);
  for (std::size_t s = 0; s < request.stage_temporaries.size() && s < stage_to_rank.size(); ++s) {
    double& r = out.at(static_cast<std::size_t>(stage_to_rank[s]));
    r = std::max(r, request.stage_temporaries[s]);
  }
  return out;
}

// The largest rank's model state under `stage_to_rank`: the sum of its stages'.
double layoutModelState(const ScheduleChoiceRequest& request, const std::vector<int>& stage_to_rank) {
  std::vector<double> rank(static_cast<std::size_t>(request.num_ranks), 0.0);
  for (std::size_t s = 0; s < request.stage_model_state.size() && s < stage_to_rank.size(); ++s) {
    rank.at(static_cast<std::size_t>(stage_to_rank[s])) += request.stage_model_state[s];
  }
  return rank.empty() ? 0.0 : *std::max_element(rank.begin(), rank.end());
}

// The simulated peak of each rank under `program` as the runtime runs it
// (lowered: adjacent I and W of a stage become one B, which never holds
// what an I keeps for W), temporaries included.
std::vector<double> rankPeaks(const ScheduleChoiceRequest& request, const sch::Program& program) {
  std::vector<double> kept = sch::simulateCost(sch::lowerForExecution(program), request.costs).peak_memory;
  const std::vector<double> extra = rankTemporaries(request, program.stage_to_rank);
  for (std::size_t r = 0; r < kept.size() && r < extra.size(); ++r) kept[r] += extra[r];
  return kept;
}

// A named schedule's simulated peak, max over ranks, temporaries included.
double namedPeak(const ScheduleChoiceRequest& request, const std::string& name) {
  sch::ScheduleConfig config;
  config.num_ranks = request.num_ranks;
  config.stages_per_rank = request.stages_per_rank;
  config.num_microbatches = request.num_microbatches;
  const sch::Program program = sch::generateSchedule(name, config);
  const std::vector<double> peaks = rankPeaks(request, program);
  return peaks.empty() ? 0.0 : *std::max_element(peaks.begin(), peaks.end());
}

}  // namespace

const char* layoutName(sch::StageLayout layout) {
  switch (layout) {
    case sch::StageLayout::kLoop: return "loop";
    case sch::StageLayout::kV: return "v";
  }
  return "?";
}

ScheduleChoice chooseSchedule(const ScheduleChoiceRequest& request) {
  const int num_stages = request.num_ranks * request.stages_per_rank;
  if (!request.stage_model_state.empty() &&
      request.stage_model_state.size() != static_cast<std::size_t>(std::max(num_stages, 0))) {
    throw sch::ScheduleError(fmt::format("auto schedule: model state given for {} stages, but the job has {}",
                                         request.stage_model_state.size(), num_stages),
                             ErrorCode::kInternal);
  }
  if (!(request.memory_headroom >= 0.0 && request.memory_headroom < 1.0)) {
    throw sch::ScheduleError(fmt::format("auto schedule: memory headroom {} is not a share in [0, 1)",
                                         request.memory_headroom),
                             ErrorCode::kInternal);
  }
  // With one stage per rank the V is the loop: searching it again finds the same.
  std::vector<sch::StageLayout> layouts{sch::StageLayout::kLoop};
  if (request.stages_per_rank > 1) layouts.push_back(sch::StageLayout::kV);

  std::optional<ScheduleChoice> best;
  std::optional<NoScheduleFits> too_small;
  std::vector<NamedScheduleTime> named;
  for (const std::string& name : sch::scheduleNames()) named.push_back(NamedScheduleTime{name, std::nullopt, std::nullopt, ""});
  for (sch::StageLayout layout : layouts) {
    sch::AutoScheduleConfig config;
    config.num_ranks = request.num_ranks;
    config.stages_per_rank = request.stages_per_rank;
    config.num_microbatches = request.num_microbatches;
    config.layout = layout;
    config.costs = request.costs;
    const double temporary = request.stage_temporaries.empty()
                                 ? 0.0
                                 : *std::max_element(request.stage_temporaries.begin(), request.stage_temporaries.end());
    const double model_state =
        request.stage_model_state.empty()
            ? 0.0
            : layoutModelState(request, sch::makeStageToRank(request.num_ranks, num_stages, layout));
    if (request.memory_limit) {
      const double smallest = sch::minimumMemoryLimit(config) + temporary;  // config has no limit yet
      const double activations = (*request.memory_limit - model_state) * (1.0 - request.memory_headroom);
      config.memory_limit = activations - temporary;
      if (activations < smallest || *config.memory_limit <= 0.0) {
        const double least = model_state + smallest / (1.0 - request.memory_headroom);
        if (!too_small || least < too_small->least_limit) too_small.emplace(smallest, layout, model_state, least);
        continue;
      }
    }
    sch::AutoScheduleResult result = sch::autoSchedule(config);

    // A named schedule runs in one layout; elsewhere it is "another layout".
    for (const sch::AutoCandidate& cand : result.candidates) {
      auto it = std::find_if(named.begin(), named.end(), [&](const NamedScheduleTime& n) { return n.name == cand.name; });
      if (it == named.end() || it->makespan) continue;
      if (cand.makespan) {
        it->makespan = cand.makespan;
        it->peak_memory = namedPeak(request, cand.name);
        it->note.clear();
      } else if (it->note.empty() || it->note == kOtherLayout) {
        it->note = cand.note;
      }
    }

    const double makespan = result.simulation.makespan;
    // Strictly faster (beyond rounding) to displace the loop's choice.
    if (best && !(makespan < best->makespan * (1.0 - 1e-9))) continue;
    ScheduleChoice choice;
    choice.program = std::move(result.program);
    choice.origin = result.origin;
    choice.layout = layout;
    choice.makespan = makespan;
    choice.model_state = model_state;
    choice.rank_peak_memory = rankPeaks(request, choice.program);
    choice.peak_memory = choice.rank_peak_memory.empty()
                             ? 0.0
                             : *std::max_element(choice.rank_peak_memory.begin(), choice.rank_peak_memory.end());
    choice.lower_bound = result.lower_bound;
    best = std::move(choice);
  }
  if (!best) throw *too_small;
  best->named = std::move(named);
  return std::move(*best);
}

NoScheduleFits::NoScheduleFits(double smallest, sch::StageLayout l, double state, double least)
    : std::runtime_error("no schedule fits the memory limit"),
      smallest_peak(smallest),
      layout(l),
      model_state(state),
      least_limit(least) {}

std::uint32_t programDigest(const sch::Program& program) {
  std::uint32_t h = 2166136261u;
  auto mix = [&](unsigned char c) { h = (h ^ c) * 16777619u; };
  for (char c : sch::programToCsv(program)) mix(static_cast<unsigned char>(c));
  for (int r : program.stage_to_rank) {
    for (int k = 0; k < 4; ++k) mix(static_cast<unsigned char>((static_cast<std::uint32_t>(r) >> (8 * k)) & 0xff));
  }
  return h;
}

}  // namespace pipeforge::train
