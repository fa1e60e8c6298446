#include "launch/rank_launcher.h"

#include <stdlib.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "common/error.h"
#include "config/train_config.h"

namespace pipeforge::train {
namespace {

namespace fs = std::filesystem;

// The first "... error: MESSAGE" line of a rank's output and what follows it
// (a runtime error may span lines: the schedule grid), without the prefix.
std::string errorIn(const std::string& output) {
  const std::string marker = "error: ";
  std::size_t at = output.find(marker);
  if (at == std::string::npos) return {};
  std::string text = output.substr(at + marker.size());
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

}  // namespace

void checkRankCount(const RankLaunch& launch) {
  if (launch.nproc < 0) throw ConfigError(fmt::format("--nproc {}: give a number of ranks >= 1", launch.nproc));
}

runtime::LaunchResult startRanks(const RankLaunch& launch, const RankCommand& command, RankOutput output) {
  runtime::LaunchOptions options;
  options.executable = fs::read_symlink("/proc/self/exe").string();
  options.args = command.args;
  options.num_ranks = command.num_ranks;
  options.master_addr = launch.master_addr;
  if (launch.master_port != 0) options.master_port = launch.master_port;
  options.capture_output = output == RankOutput::kCaptured;
  // Note [Fast stop]: once a rank failed, the others learn it through the
  // store within a poll (Note [Failure broadcast]) and exit by themselves,
  // well inside this grace; a rank that cannot learn it (the process group
  // never formed, so it still waits in the rendezvous) is killed when the
  // grace ends, instead of waiting out its timeout. Checkpoints are
  // committed atomically, so a kill never leaves a torn one.
  options.grace = std::chrono::seconds(3);
  // Every wait of a rank is bounded by its own timeout; this bound only
  // catches a launcher bug, so it is longer than any run.
  options.timeout = output == RankOutput::kTerminal ? std::chrono::hours(24 * 365) : std::chrono::hours(24);
  return runtime::launchLocal(options);
}

std::string runRanksForOutput(const RankLaunch& launch, const RankCommand& command) {
  const runtime::LaunchResult result = startRanks(launch, command, RankOutput::kCaptured);
  if (result.ok()) return result.ranks.at(0).output;
  const runtime::RankExit& failed = result.ranks.at(*result.causeRank());
  const std::string error = errorIn(failed.output);
  const ErrorCode code = errorCodeForExitStatus(result.exitStatus());  // Note [Run exit status]
  if (!error.empty()) throw Error(code, error);
  throw Error(code, fmt::format("the ranks failed:\n{}", result.summary()));
}

ScratchDir::ScratchDir(const std::string& prefix) {
  std::error_code ec;
  fs::path base = fs::temp_directory_path(ec);
  if (ec) base = "/tmp";
  std::string tmpl = (base / (prefix + "XXXXXX")).string();
  if (::mkdtemp(tmpl.data()) == nullptr) {
    throw Error(ErrorCode::kIo, fmt::format("cannot make a scratch folder {}: {}; set TMPDIR to a writable folder",
                                            tmpl, std::strerror(errno)));
  }
  path_ = tmpl;
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

}  // namespace pipeforge::train
