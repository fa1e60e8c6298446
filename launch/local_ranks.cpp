#include "launch/local_ranks.h"

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "common/error.h"
#include "runtime/local_launcher.h"

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

std::string runLocalRanks(const LocalRanksOptions& options) {
  runtime::LaunchOptions launch;
  launch.executable = fs::read_symlink("/proc/self/exe").string();
  launch.args = options.args;
  launch.num_ranks = options.num_ranks;
  launch.master_addr = options.master_addr;
  launch.master_port = options.master_port;
  launch.capture_output = true;
  // Note [Fast stop] in launch/launch.cpp: the same grace as training.
  launch.grace = std::chrono::seconds(3);
  launch.timeout = options.timeout;
  const runtime::LaunchResult result = runtime::launchLocal(launch);
  if (result.ok()) return result.ranks.at(0).output;
  const runtime::RankExit& failed = result.ranks.at(*result.causeRank());
  const std::string error = errorIn(failed.output);
  const ErrorCode code = errorCodeForExitStatus(result.exitStatus());  // Note [Run exit status]
  if (!error.empty()) throw Error(code, error);
  throw Error(code, fmt::format("the ranks failed:\n{}", result.summary()));
}

}  // namespace pipeforge::train
