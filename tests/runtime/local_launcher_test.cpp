#include "runtime/local_launcher.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

namespace pipeforge::runtime {
namespace {

LaunchOptions shell(const std::string& script, int ranks) {
  LaunchOptions o;
  o.executable = "/bin/sh";
  o.args = {"-c", script};
  o.num_ranks = ranks;
  o.grace = std::chrono::milliseconds(300);
  return o;
}

TEST(LocalLauncherTest, SetsTheTorchrunVariablesPerRank) {
  LaunchResult r = launchLocal(shell("echo $RANK/$WORLD_SIZE/$LOCAL_RANK/$MASTER_ADDR/$MASTER_PORT", 3));
  ASSERT_TRUE(r.ok()) << r.summary();
  ASSERT_EQ(r.ranks.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r.ranks[i].output, std::to_string(i) + "/3/" + std::to_string(i) + "/127.0.0.1/" +
                                     std::to_string(r.master_port) + "\n");
  }
}

TEST(LocalLauncherTest, StopsTheOthersAfterTheGraceWhenOneFails) {
  LaunchResult r = launchLocal(shell("if [ $RANK = 1 ]; then echo boom; exit 3; fi; sleep 30", 3));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(*r.first_failed, 1);
  EXPECT_EQ(r.ranks[1].exit_code, 3);
  EXPECT_TRUE(r.ranks[0].killed_by_launcher);
  EXPECT_LT(r.ranks[0].seconds, 10.0);
  std::string summary = r.summary();
  EXPECT_NE(summary.find("rank 1: exit 3"), std::string::npos) << summary;
  EXPECT_NE(summary.find("boom"), std::string::npos) << summary;
}

TEST(LocalLauncherTest, KillsEverythingAtTheTimeout) {
  LaunchOptions o = shell("sleep 30", 2);
  o.timeout = std::chrono::milliseconds(300);
  LaunchResult r = launchLocal(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.ranks[0].signal, 9);
  EXPECT_LT(r.ranks[1].seconds, 10.0);
}

TEST(LocalLauncherTest, ReportsAnExecutableThatCannotRun) {
  LaunchOptions o;
  o.executable = "/nonexistent/worker";
  EXPECT_THROW(launchLocal(o), LaunchError);
}

// Note [Run exit status]: the run exits with the status of the rank that
// caused it, even when a rank that only saw the failure (4) exited first.
TEST(LocalLauncherTest, RunExitStatusIsTheCausingRanks) {
  EXPECT_EQ(launchLocal(shell("exit 0", 2)).exitStatus(), 0);
  // Rank 1 exits by itself after 0.3 s: a grace far past that, so that a
  // loaded machine never turns its exit into the launcher's kill.
  LaunchOptions peer = shell("if [ $RANK = 0 ]; then exit 4; fi; sleep 0.3; exit 3", 2);
  peer.grace = std::chrono::seconds(10);
  LaunchResult peer_first = launchLocal(peer);
  EXPECT_EQ(*peer_first.first_failed, 0);
  EXPECT_EQ(peer_first.exitStatus(), 3) << peer_first.summary();
  EXPECT_EQ(launchLocal(shell("exit 4", 2)).exitStatus(), 4);
  EXPECT_EQ(launchLocal(shell("if [ $RANK = 1 ]; then exit 70; fi; sleep 30", 2)).exitStatus(), 70);
  // A rank killed by a signal is, for the launcher, a peer that died.
  EXPECT_EQ(launchLocal(shell("kill -9 $$", 1)).exitStatus(), 4);
}

TEST(LocalLauncherTest, FindsAFreePort) {
  int port = findFreePort();
  EXPECT_GT(port, 0);
  EXPECT_LT(port, 65536);
}

// Note [Threads per rank]: unless the user chose OMP_NUM_THREADS, each rank
// gets its share of the cores, and the ranks see the same number that the
// CPU reservation counts with (threadsPerRank).
TEST(LocalLauncherTest, EachRankGetsItsShareOfTheCoresUnlessTheUserChose) {
  const char* outer = std::getenv("OMP_NUM_THREADS");
  const std::optional<std::string> saved = outer ? std::optional<std::string>(outer) : std::nullopt;
  ::unsetenv("OMP_NUM_THREADS");
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));

  LaunchOptions o = shell("echo $OMP_NUM_THREADS", 2);
  EXPECT_EQ(threadsPerRank(o), std::max(1, cores / 2));
  LaunchResult r = launchLocal(o);
  ASSERT_TRUE(r.ok()) << r.summary();
  for (const auto& rank : r.ranks) EXPECT_EQ(rank.output, std::to_string(threadsPerRank(o)) + "\n");

  o.num_ranks = 4 * cores;  // more ranks than cores: still one thread each
  EXPECT_EQ(threadsPerRank(o), 1);

  o.num_ranks = 2;
  o.env = {{"OMP_NUM_THREADS", "3"}};
  EXPECT_EQ(threadsPerRank(o), 3);
  r = launchLocal(o);
  ASSERT_TRUE(r.ok()) << r.summary();
  for (const auto& rank : r.ranks) EXPECT_EQ(rank.output, "3\n");

  o.env.clear();
  ::setenv("OMP_NUM_THREADS", "5", 1);
  EXPECT_EQ(threadsPerRank(o), 5);
  r = launchLocal(o);
  ASSERT_TRUE(r.ok()) << r.summary();
  for (const auto& rank : r.ranks) EXPECT_EQ(rank.output, "5\n");

  if (saved) {
    ::setenv("OMP_NUM_THREADS", saved->c_str(), 1);
  } else {
    ::unsetenv("OMP_NUM_THREADS");
  }
}

// Note [Launch folders]: a launcher killed with SIGKILL leaves its folder;
// the next launch removes it once no launcher holds its owner lock, and
// leaves a live launcher's folder and one not yet claimed.
TEST(LocalLauncherTest, RemovesTheFoldersOfLaunchersThatAreGone) {
  namespace fs = std::filesystem;
  std::string root_template = (fs::temp_directory_path() / "pf-sweep-XXXXXX").string();
  ASSERT_NE(::mkdtemp(root_template.data()), nullptr);
  const fs::path root(root_template);
  const std::string prefix = (root / "launch-").string();
  for (const char* name : {"launch-gone", "launch-live", "launch-unclaimed", "other-gone"}) {
    fs::create_directories(root / name / "store");
  }
  for (const char* name : {"launch-gone", "launch-live", "other-gone"}) std::ofstream(root / name / "owner");
  const int live = ::open((root / "launch-live" / "owner").c_str(), O_RDWR);
  ASSERT_GE(live, 0);
  ASSERT_EQ(::flock(live, LOCK_EX | LOCK_NB), 0);

  fs::create_directories(root / "launch-claiming");  // killed while claiming: left alone
  std::ofstream(root / "launch-claiming" / "owner.tmp");

  removeAbandonedLaunchFolders(prefix);
  EXPECT_TRUE(fs::exists(root / "launch-claiming"));
  EXPECT_FALSE(fs::exists(root / "launch-gone"));
  EXPECT_TRUE(fs::exists(root / "launch-live" / "store"));
  EXPECT_TRUE(fs::exists(root / "launch-unclaimed"));
  EXPECT_TRUE(fs::exists(root / "other-gone"));  // not this prefix

  ::close(live);  // its launcher ends without removing it (SIGKILL)
  removeAbandonedLaunchFolders(prefix);
  EXPECT_FALSE(fs::exists(root / "launch-live"));
  fs::remove_all(root);
}

// A run's own folder survives sweeps while the run goes on, from the moment
// its folder is made (the sweeper runs without pause, so it also sweeps while
// the launcher claims the folder), and is gone once it returns.
TEST(LocalLauncherTest, ARunsFolderIsHeldWhileItRunsAndGoneAfter) {
  namespace fs = std::filesystem;
  LaunchOptions o = shell("sleep 0.6; test -d \"$PIPEFORGE_STORE_DIR\" && echo \"$PIPEFORGE_STORE_DIR\"", 2);
  std::atomic<bool> done{false};
  std::thread sweeper([&done] {
    while (!done.load()) removeAbandonedLaunchFolders(kLaunchFolderPrefix);
  });
  LaunchResult r = launchLocal(o);
  done = true;
  sweeper.join();
  ASSERT_TRUE(r.ok()) << r.summary();
  const std::string store = r.ranks[0].output.substr(0, r.ranks[0].output.find('\n'));
  ASSERT_EQ(store.rfind(kLaunchFolderPrefix, 0), 0u) << store;
  EXPECT_FALSE(fs::exists(fs::path(store).parent_path())) << store;
}

}  // namespace
}  // namespace pipeforge::runtime
