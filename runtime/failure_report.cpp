#include "runtime/failure_report.h"

#include <cstdlib>

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

// Note [One report per terminal]: the ranks `pipeforge train --nproc N`
// starts share its terminal, where the failed rank prints its own report; a
// rank it stopped then names it in one line instead of printing it again.
// Elsewhere (torchrun, srun, several hosts) each rank prints the cause whole,
// since its terminal or log may be the only one a user reads.
std::string stoppedByPeerReport(int rank, const schedules::Action* action, int step, const std::string& peer_report) {
  // Only a rank's own report is printed by that rank; anything else read from
  // the store (a malformed key, Note [Store exposure]) is printed here.
  const std::string first = peer_report.substr(0, peer_report.find('\n'));
  const auto failed = first.find(" failed:");
  if (std::getenv(kBriefPeerReportsVariable) != nullptr && first.rfind("rank ", 0) == 0 &&
      failed != std::string::npos) {
    return fmt::format("{} stopped because {} failed (that rank's error is printed above or below)",
                       failurePlace(rank, action, step), first.substr(0, failed));
  }
  return fmt::format("{} stopped because another rank failed:\n{}", failurePlace(rank, action, step), peer_report);
}

}  // namespace pipeforge::runtime
