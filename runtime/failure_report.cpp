#include "runtime/failure_report.h"

#include <fmt/format.h>

#include "schedules/format_grid.h"

namespace pipeforge::runtime {

std::string failurePlace(int rank, const schedules::Action* action, int step) {
  if (action == nullptr) return fmt::format("rank {} at the end of the step", rank);
  return fmt::format("rank {} at step {} (action {})", rank, step, schedules::formatAction(*action));
}

std::string failureReport(const schedules::Program& program, int pipeline_rank, int rank,
                          const schedules::Action* action, int step, const std::string& what) {
  const std::string grid = action != nullptr ? schedules::formatGrid(program, step) : std::string();
  return fmt::format("{} failed: {}\n{}", failurePlace(rank, action, step), what,
                     grid.empty() ? "" : fmt::format("schedule (rank {} is column 'Rank {}'):\n{}", pipeline_rank,
                                                     pipeline_rank, grid));
}

std::string stoppedByPeerReport(int rank, const schedules::Action* action, int step, const std::string& peer_report) {
  return fmt::format("{} stopped because another rank failed:\n{}", failurePlace(rank, action, step), peer_report);
}

}  // namespace pipeforge::runtime
