// Two runs in one folder (issue 39 item 2, Note [One run per folder]): while
// a run trains, a second `pipeforge train` with the same output.dir is
// refused before it splits or starts a rank, naming the first run's PID and
// host, with the launcher and as a torchrun-style rank alike; once the first
// is SIGKILLed, the same command takes the folder over with a warning and
// resumes, and metrics.jsonl holds no run of the refused commands.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "checkpoint/checkpoint.h"
#include "tests/support/build_paths.h"
#include "tests/train/train_fixture.h"

namespace pipeforge::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string readText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

int countOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(RunLock, ASecondRunInTheSameFolderIsRefusedAndADeadOnesLockIsTakenOver) {
  TrainWorkspace ws;
  RunSpec s;
  s.split = "num_stages: 2\n  policy: parameters";
  s.steps = 1000000;
  s.checkpoint_every = 2;
  const std::string config = ws.writeConfig("shared", s);
  const std::string log = ws.dir() + "/first.log";
  const std::string ckpt = ws.checkpointDir("shared");

  const pid_t first = startTrainInBackground(config, log);
  ASSERT_GT(first, 0);
  auto stop_first = [&] {
    ::kill(-first, SIGKILL);
    ::waitpid(first, nullptr, 0);
  };
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (Clock::now() < deadline && !fs::exists(train::checkpointDir(ckpt, 2))) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!fs::exists(train::checkpointDir(ckpt, 2))) {
    stop_first();
    FAIL() << "the first run wrote no checkpoint:\n" << readText(log);
  }

  // The launcher: refused before the split, naming the holder.
  const std::string holder = fmt::format("is in use by another run (PID {} on host ", first);
  CommandResult second = runPipeforge(fmt::format("train --config '{}' --nproc 2", config));
  // A rank of a torchrun/srun job (no launcher): its rank 0 is refused alike.
  CommandResult rank = runPipeforge(fmt::format("train --config '{}'", config));
  const std::string metrics_while_running = readText(ws.outDir("shared") + "/metrics.jsonl");
  stop_first();

  EXPECT_EQ(second.exit_code, 1) << second.output;
  EXPECT_NE(second.output.find(fmt::format("output.dir '{}' {}", ws.outDir("shared"), holder)), std::string::npos)
      << second.output;
  EXPECT_NE(second.output.find("--set output.dir=OTHER_DIR"), std::string::npos) << second.output;
  EXPECT_EQ(second.output.find("split "), std::string::npos) << "refused before the split:\n" << second.output;
  EXPECT_EQ(rank.exit_code, 1) << rank.output;
  EXPECT_NE(rank.output.find(holder), std::string::npos) << rank.output;
  EXPECT_EQ(countOf(metrics_while_running, "\"event\":\"start\""), 1) << metrics_while_running;

  // The first run is gone without releasing the lock: the same command takes
  // the folder over, says so, and resumes from its newest checkpoint.
  auto latest = train::latestCheckpoint(ckpt);
  ASSERT_TRUE(latest);
  const std::int64_t step = train::readCheckpointMeta(*latest).step;
  CommandResult resumed =
      runPipeforge(fmt::format("train --config '{}' --nproc 2 --stop-after {}", config, step + 1));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find(fmt::format("taking over the lock left by PID {} on host ", first)),
            std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find(fmt::format("at step {}", step)), std::string::npos) << resumed.output;
  const std::string metrics = readText(ws.outDir("shared") + "/metrics.jsonl");
  EXPECT_EQ(countOf(metrics, "\"event\":\"start\""), 2) << metrics;
}

}  // namespace
}  // namespace pipeforge::testing
