// The launcher side of `pipeforge generate` and `pipeforge eval`: a private
// scratch folder (the in-memory split of the model goes there, for the ranks
// to load), and this executable re-run as N local ranks whose rank 0 prints
// the result.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace pipeforge::train {

// A fresh folder under the system's temporary directory (mode 0700),
// removed with everything in it when destroyed.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix);
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct LocalRanksOptions {
  std::vector<std::string> args;  // after the executable: the command and its options, for every rank
  int num_ranks = 1;
  std::string master_addr = "127.0.0.1";
  std::optional<int> master_port;
  std::chrono::milliseconds timeout{std::chrono::hours(24)};
};

// Runs the ranks with their output captured and returns rank 0's output.
// When a rank fails, throws pipeforge::Error with the code of the run's exit
// status (Note [Run exit status]) and the first failed rank's error message
// (the text after "error: " in its output), or the launcher's summary when it
// left none.
std::string runLocalRanks(const LocalRanksOptions& options);

}  // namespace pipeforge::train
