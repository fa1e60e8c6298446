// Interrupted runs: stopping after step k and resuming to K gives the
// checkpoints and parameters of a run straight to K, bit for bit; a rank
// killed mid-run stops the others within the timeout, and the last
// checkpoint is intact and resumes.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "checkpoint/checkpoint.h"
#include "tests/support/build_paths.h"
#include "tests/train/train_fixture.h"

namespace pipeforge::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

RunSpec gptTwoStages() {
  RunSpec s;
  s.split = "num_stages: 2\n  policy: parameters";
  s.optimizer = "{name: adam, lr: 1.0e-3}";
  return s;
}

// Two stage files hold the same optimizer state, parameter by parameter.
void expectSameOptimizerState(const train::StageOptimizerState& x, const train::StageOptimizerState& y) {
  EXPECT_EQ(x.name, y.name);
  ASSERT_EQ(x.by_name.size(), y.by_name.size());
  for (const auto& [name, a] : x.by_name) {
    ASSERT_TRUE(y.by_name.count(name)) << name;
    const auto& b = y.by_name.at(name);
    EXPECT_EQ(a.step, b.step) << name;
    ASSERT_EQ(a.slots.size(), b.slots.size()) << name;
    for (std::size_t k = 0; k < a.slots.size(); ++k) {
      EXPECT_EQ(a.slots[k].first, b.slots[k].first) << name;
      EXPECT_TRUE(at::equal(a.slots[k].second, b.slots[k].second)) << name << " " << a.slots[k].first;
    }
  }
}

void expectSameCheckpoint(const std::string& a, const std::string& b, int num_stages) {
  for (int s = 0; s < num_stages; ++s) {
    SCOPED_TRACE(fmt::format("{} vs {}, stage {}", a, b, s));
    auto x = train::readStageCheckpoint(a, s);
    auto y = train::readStageCheckpoint(b, s);
    EXPECT_EQ(x.step, y.step);
    EXPECT_EQ(x.data_position, y.data_position);
    ASSERT_EQ(x.parameters.size(), y.parameters.size());
    for (std::size_t k = 0; k < x.parameters.size(); ++k) {
      EXPECT_EQ(x.parameters[k].first, y.parameters[k].first);
      EXPECT_TRUE(at::equal(x.parameters[k].second, y.parameters[k].second)) << x.parameters[k].first;
    }
    for (std::size_t k = 0; k < x.buffers.size(); ++k) EXPECT_TRUE(at::equal(x.buffers[k].second, y.buffers[k].second));
    EXPECT_TRUE(at::equal(x.rng_state, y.rng_state));
    EXPECT_FALSE(x.optimizer.by_name.empty());
    expectSameOptimizerState(x.optimizer, y.optimizer);
  }
}

TEST(Resume, StopAndResumeMatchesAStraightRun) {
  TrainWorkspace ws;
  RunSpec s = gptTwoStages();
  s.steps = 4;
  s.checkpoint_every = 1;
  const std::string straight = ws.writeConfig("straight", s);
  const std::string resumed = ws.writeConfig("resumed", s);

  auto a = runPipeforge(fmt::format("train --config '{}' --nproc 2", straight));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  auto b1 = runPipeforge(fmt::format("train --config '{}' --nproc 2 --stop-after 2", resumed));
  ASSERT_EQ(b1.exit_code, 0) << b1.output;
  EXPECT_EQ(*train::latestCheckpoint(ws.checkpointDir("resumed")), train::checkpointDir(ws.checkpointDir("resumed"), 2));
  EXPECT_FALSE(fs::exists(train::checkpointDir(ws.checkpointDir("resumed"), 3)));
  auto b2 = runPipeforge(fmt::format("train --config '{}' --nproc 2", resumed));
  ASSERT_EQ(b2.exit_code, 0) << b2.output;
  EXPECT_NE(b2.output.find("resumed from"), std::string::npos) << b2.output;
  EXPECT_NE(b2.output.find("at step 2"), std::string::npos) << b2.output;

  for (int step = 1; step <= 4; ++step) {
    expectSameCheckpoint(train::checkpointDir(ws.checkpointDir("straight"), step),
                         train::checkpointDir(ws.checkpointDir("resumed"), step), 2);
  }

  // --stop-after is an absolute step: below the checkpoint, the message names the option.
  auto c = runPipeforge(fmt::format("train --config '{}' --nproc 2 --stop-after 2", resumed));
  EXPECT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(c.output.find("nothing to train: the checkpoint is at step 4 and the run stops at 2 (--stop-after 2 is an "
                          "absolute step; give one above 4)"),
            std::string::npos)
      << c.output;
}

// The rank processes the launcher `launcher` started, by RANK.
pid_t findRank(pid_t launcher, int rank) {
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    auto close = text.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(text.substr(close + 2));
    char state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid != launcher) continue;
    std::string env = readBytes((entry.path() / "environ").string());
    if (env.find(fmt::format("{}RANK={}{}", '\0', rank, '\0')) != std::string::npos) return std::stoi(name);
  }
  return -1;
}

// Issue 39 item 7: Ctrl-C while `pipeforge train --nproc 2` starts, during
// the split or while its ranks have not yet installed their handlers (they
// died of the signal, and the run exited 4, "a rank failed"), exits 130
// saying the run was interrupted before training started.
class InterruptAtStart : public ::testing::TestWithParam<const char*> {};

TEST_P(InterruptAtStart, Exits130BeforeTraining) {
  const std::string when = GetParam();
  TrainWorkspace ws;
  RunSpec s = gptTwoStages();
  s.steps = 1000;
  const std::string config = ws.writeConfig("start", s);
  const std::string log = ws.dir() + "/launcher.log";
  const pid_t launcher = startTrainInBackground(config, log);
  ASSERT_GT(launcher, 0);
  auto stop = [&] {
    ::kill(-launcher, SIGKILL);
    ::waitpid(launcher, nullptr, 0);
  };
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  // The launcher catches SIGINT from its first lines on.
  while (Clock::now() < deadline && !catches(launcher, SIGINT)) std::this_thread::yield();
  if (when == "spawn") {
    // A rank exec'd (its environment has RANK=0, which findRank reads) but
    // with no handler yet.
    pid_t rank = -1;
    while (Clock::now() < deadline && (rank = findRank(launcher, 0)) <= 0) std::this_thread::yield();
    if (rank <= 0 || catches(rank, SIGINT)) {
      stop();
      GTEST_SKIP() << "rank 0 installed its handlers before the test could interrupt it:\n" << readBytes(log);
    }
  }
  ASSERT_EQ(::kill(-launcher, SIGINT), 0);  // a terminal's Ctrl-C: the whole group
  int status = 0;
  while (::waitpid(launcher, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      stop();
      FAIL() << "the run did not stop:\n" << readBytes(log);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::string output = readBytes(log);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status) << ":\n" << output;
  EXPECT_EQ(WEXITSTATUS(status), 130) << output;
  EXPECT_EQ(output.find("the run failed"), std::string::npos) << output;
  EXPECT_NE(output.find("interrupted by SIGINT before training started; nothing to resume"), std::string::npos)
      << output;
  EXPECT_FALSE(train::latestCheckpoint(ws.checkpointDir("start"))) << output;
}

INSTANTIATE_TEST_SUITE_P(Train, InterruptAtStart, ::testing::Values("split", "spawn"));

class KillOneRank : public ::testing::TestWithParam<int> {};

TEST_P(KillOneRank, OthersStopWithinTheTimeoutAndTheCheckpointResumes) {
  const int victim = GetParam();
  constexpr double kTimeout = 10.0;
  TrainWorkspace ws;
  RunSpec s = gptTwoStages();
  s.steps = 1000000;
  s.checkpoint_every = 3;
  s.timeout_s = kTimeout;
  const std::string config = ws.writeConfig("killed", s);
  const std::string log = ws.dir() + "/launcher.log";
  const std::string ckpt = ws.checkpointDir("killed");

  pid_t launcher = ::fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execl(PIPEFORGE_BINARY, PIPEFORGE_BINARY, "train", "--config", config.c_str(), "--nproc", "2", nullptr);
    ::_exit(127);
  }
  // Wait for the second checkpoint, so the kill lands in the middle of
  // training: for the `latest` pointer to name it, which rank 0 writes just
  // after the folder is sealed (the folder alone may be there a moment before).
  auto second_done = [&] {
    try {
      const auto latest = train::latestCheckpoint(ckpt);
      return latest && train::readCheckpointMeta(*latest).step >= 6;
    } catch (const std::exception&) {
      return false;
    }
  };
  auto deadline = Clock::now() + std::chrono::seconds(120);
  while (Clock::now() < deadline && !second_done()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  pid_t rank = findRank(launcher, victim);
  if (rank <= 0 || !second_done()) {
    ::kill(launcher, SIGKILL);
    ::waitpid(launcher, nullptr, 0);
    FAIL() << "no checkpoint or rank " << victim << " process:\n" << readBytes(log);
  }
  ASSERT_EQ(::kill(rank, SIGKILL), 0);
  const auto killed_at = Clock::now();

  int status = 0;
  while (::waitpid(launcher, &status, WNOHANG) == 0) {
    if (Clock::now() - killed_at > std::chrono::seconds(60)) {
      ::kill(launcher, SIGKILL);
      ::waitpid(launcher, &status, 0);
      FAIL() << "the launcher did not stop within 60 s:\n" << readBytes(log);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double stopped_after = std::chrono::duration<double>(Clock::now() - killed_at).count();
  const std::string output = readBytes(log);
  RecordProperty("seconds_to_stop", fmt::format("{:.2f}", stopped_after));
  std::cout << fmt::format("[ rank {} killed ] the job stopped {:.2f} s later\n", victim, stopped_after);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << output;
  EXPECT_LT(stopped_after, kTimeout) << output;
  EXPECT_NE(output.find(fmt::format("rank {}: killed by signal 9", victim)), std::string::npos) << output;
  EXPECT_EQ(output.find("stopped by the launcher"), std::string::npos) << "survivors must stop by themselves:\n" << output;

  // The newest checkpoint is whole, and training resumes from it.
  auto latest = train::latestCheckpoint(ckpt);
  ASSERT_TRUE(latest) << output;
  auto meta = train::readCheckpointMeta(*latest);
  EXPECT_GE(meta.step, 6);
  for (int st = 0; st < 2; ++st) EXPECT_NO_THROW(train::readStageCheckpoint(*latest, st));
  auto resumed = runPipeforge(fmt::format("train --config '{}' --nproc 2 --stop-after {}", config, meta.step + 2));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find(fmt::format("at step {}", meta.step)), std::string::npos) << resumed.output;
}

INSTANTIATE_TEST_SUITE_P(Train, KillOneRank, ::testing::Values(1, 0),
                         [](const ::testing::TestParamInfo<int>& info) { return fmt::format("rank{}", info.param); });

// Note [Graceful interrupts]: SIGINT or SIGTERM sent to the launcher, to one
// rank, or to the whole process group (a terminal's Ctrl-C) stops every rank
// after the same step, with that step's checkpoint, and exit status 128 +
// signal. The checkpoint is the one an uninterrupted run writes at that step,
// bit for bit, and resuming from it continues as that run does.
struct InterruptCase {
  const char* target;  // "launcher", "rank1" or "group"
  int signal;
  // Started by torchrun (its agent is then the "launcher"): the agent sends
  // its workers the signal it got, and exits with a status of its own.
  bool torchrun = false;
};

class Interrupt : public ::testing::TestWithParam<InterruptCase> {};

TEST_P(Interrupt, CheckpointsTheStepItStoppedAtAndResumesBitForBit) {
  const InterruptCase c = GetParam();
  if (c.torchrun) {
    if (std::string why = torchrunUnusable(); !why.empty()) {
      GTEST_SKIP() << PIPEFORGE_PYTHON << " -m torch.distributed.run cannot start even /bin/true: " << why;
    }
  }
  TrainWorkspace ws;
  RunSpec s = gptTwoStages();
  s.steps = 1000;  // far more than the test runs: the interrupt ends it
  s.checkpoint_every = 1000;
  s.output = ", log_every: 1";
  const std::string config = ws.writeConfig("interrupted", s);
  RunSpec every_step = s;
  every_step.checkpoint_every = 1;
  const std::string straight = ws.writeConfig("straight", every_step);
  const std::string log = ws.dir() + "/launcher.log";
  const std::string ckpt = ws.checkpointDir("interrupted");
  const std::string metrics = ws.outDir("interrupted") + "/metrics.jsonl";

  pid_t launcher = ::fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    ::setpgid(0, 0);  // a group of its own, as a terminal's foreground job
    // As a script's background job: SIGINT inherited as ignored (the handler must still get it).
    ::signal(SIGINT, SIG_IGN);
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    if (c.torchrun) {
      ::execl(PIPEFORGE_PYTHON, PIPEFORGE_PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
              "2", "--no_python", PIPEFORGE_BINARY, "train", "--config", config.c_str(), nullptr);
    } else {
      ::execl(PIPEFORGE_BINARY, PIPEFORGE_BINARY, "train", "--config", config.c_str(), "--nproc", "2", nullptr);
    }
    ::_exit(127);
  }
  auto stop = [&] {
    ::kill(-launcher, SIGKILL);
    ::waitpid(launcher, nullptr, 0);
  };
  // Mid-run: after step 3 is logged.
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (Clock::now() < deadline && readBytes(metrics).find("\"step\":3") == std::string::npos) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (readBytes(metrics).find("\"step\":3") == std::string::npos) {
    stop();
    FAIL() << "step 3 was never logged:\n" << readBytes(log);
  }
  const std::string target = c.target;
  pid_t to = target == "launcher" ? launcher : target == "group" ? -launcher : findRank(launcher, 1);
  if (to == -1 || to == 0) {
    stop();
    FAIL() << "no rank 1 process:\n" << readBytes(log);
  }
  ASSERT_EQ(::kill(to, c.signal), 0);

  int status = 0;
  const auto sent = Clock::now();
  while (::waitpid(launcher, &status, WNOHANG) == 0) {
    if (Clock::now() - sent > std::chrono::seconds(60)) {
      stop();
      FAIL() << "the run did not stop within 60 s of the signal:\n" << readBytes(log);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string output = readBytes(log);
  ASSERT_TRUE(WIFEXITED(status)) << "the launcher was killed by signal " << WTERMSIG(status) << ":\n" << output;
  if (c.torchrun) {
    // torchrun reports its workers' 130/143, or the signal it got, with a
    // status of its own; what matters is the checkpoint below.
    EXPECT_NE(WEXITSTATUS(status), 0) << output;
  } else {
    EXPECT_EQ(WEXITSTATUS(status), 128 + c.signal) << output;
    EXPECT_EQ(output.find("the run failed"), std::string::npos) << output;
  }

  auto latest = train::latestCheckpoint(ckpt);
  ASSERT_TRUE(latest) << output;
  const std::int64_t k = train::readCheckpointMeta(*latest).step;
  EXPECT_GE(k, 3);
  EXPECT_LT(k, 1000);
  const std::string name = c.signal == SIGINT ? "SIGINT" : "SIGTERM";
  EXPECT_NE(output.find(fmt::format("interrupted by {} at step {}; checkpoint step_{:08d}; resume with the same command",
                                    name, k, k)),
            std::string::npos)
      << output;

  // An uninterrupted run writes the same checkpoint at step k ...
  auto a = runPipeforge(fmt::format("train --config '{}' --nproc 2 --stop-after {}", straight, k + 2));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  expectSameCheckpoint(train::checkpointDir(ws.checkpointDir("straight"), k), *latest, 2);
  // ... and resuming the interrupted one continues as it does.
  auto b = runPipeforge(fmt::format("train --config '{}' --nproc 2 --stop-after {}", config, k + 2));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find(fmt::format("at step {}", k)), std::string::npos) << b.output;
  expectSameCheckpoint(train::checkpointDir(ws.checkpointDir("straight"), k + 2), train::checkpointDir(ckpt, k + 2), 2);
}

INSTANTIATE_TEST_SUITE_P(Train, Interrupt,
                         ::testing::Values(InterruptCase{"launcher", SIGINT}, InterruptCase{"launcher", SIGTERM},
                                           InterruptCase{"rank1", SIGINT}, InterruptCase{"rank1", SIGTERM},
                                           InterruptCase{"group", SIGINT},
                                           InterruptCase{"launcher", SIGINT, true},
                                           InterruptCase{"launcher", SIGTERM, true},
                                           InterruptCase{"rank1", SIGINT, true},
                                           InterruptCase{"rank1", SIGTERM, true}),
                         [](const ::testing::TestParamInfo<InterruptCase>& info) {
                           return fmt::format("{}{}_{}", info.param.torchrun ? "torchrun_" : "", info.param.target,
                                              info.param.signal == SIGINT ? "SIGINT" : "SIGTERM");
                         });

}  // namespace
}  // namespace pipeforge::testing
