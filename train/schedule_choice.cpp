#include "train/schedule_choice.h"

#include <algorithm>

#include "schedules/auto_schedule.h"
#include "schedules/csv.h"
#include "schedules/generate.h"

namespace pipeforge::train {
namespace {

namespace sch = pipeforge::schedules;

// autoSchedule's note for a named schedule of the other layout; it only
// decides which note is kept when neither layout can run the schedule.
constexpr const char* kOtherLayout = "places its stages in another layout";

}  // namespace

const char* layoutName(sch::StageLayout layout) {
  switch (layout) {
    case sch::StageLayout::kLoop: return "loop";
    case sch::StageLayout::kV: return "v";
  }
  return "?";
}

ScheduleChoice chooseSchedule(const ScheduleChoiceRequest& request) {
  // With one stage per rank the V is the loop: searching it again finds the same.
  std::vector<sch::StageLayout> layouts{sch::StageLayout::kLoop};
  if (request.stages_per_rank > 1) layouts.push_back(sch::StageLayout::kV);

  std::optional<ScheduleChoice> best;
  std::vector<NamedScheduleTime> named;
  for (const std::string& name : sch::scheduleNames()) named.push_back(NamedScheduleTime{name, std::nullopt, ""});
  for (sch::StageLayout layout : layouts) {
    sch::AutoScheduleConfig config;
    config.num_ranks = request.num_ranks;
    config.stages_per_rank = request.stages_per_rank;
    config.num_microbatches = request.num_microbatches;
    config.layout = layout;
    config.costs = request.costs;
    sch::AutoScheduleResult result = sch::autoSchedule(config);

    // A named schedule runs in one layout; elsewhere it is "another layout".
    for (const sch::AutoCandidate& cand : result.candidates) {
      auto it = std::find_if(named.begin(), named.end(), [&](const NamedScheduleTime& n) { return n.name == cand.name; });
      if (it == named.end() || it->makespan) continue;
      if (cand.makespan) {
        it->makespan = cand.makespan;
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
    const auto& peaks = result.simulation.peak_memory;
    choice.peak_memory = peaks.empty() ? 0.0 : *std::max_element(peaks.begin(), peaks.end());
    choice.lower_bound = result.lower_bound;
    best = std::move(choice);
  }
  best->named = std::move(named);
  return std::move(*best);
}

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
