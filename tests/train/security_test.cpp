// Note [Store exposure] and Note [Checked store values], end to end: a local
// run listens on loopback only, and garbage written into its store stops it
// with a message naming the key, without a crash or a hang.
#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "compat/c10d_store.h"
#include "tests/support/build_paths.h"
#include "tests/train/train_fixture.h"

extern char** environ;

namespace pipeforge::testing {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// `pipeforge train --config C --nproc 2` in the background, output to a file.
class BackgroundRun {
 public:
  BackgroundRun(const std::string& config, const std::string& log) : log_(log) {
    std::vector<std::string> args = {PIPEFORGE_BINARY, "train", "--config", config, "--nproc", "2"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    if (posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
  }
  ~BackgroundRun() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);  // the ranks die with it (PR_SET_PDEATHSIG)
      ::waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  std::string output() const { return readBytes(log_); }

  // The exit status within `limit`, or nullopt (then the run is killed).
  std::optional<int> wait(std::chrono::milliseconds limit) {
    auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
        return WEXITSTATUS(status);
      }
      std::this_thread::sleep_for(20ms);
    }
    return std::nullopt;
  }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  std::string log_;
};

// The processes whose parent is `parent` (the launcher's ranks).
std::vector<pid_t> childrenOf(pid_t parent) {
  std::vector<pid_t> out;
  DIR* proc = ::opendir("/proc");
  if (!proc) return out;
  while (dirent* e = ::readdir(proc)) {
    pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0) continue;
    std::string stat = readBytes(fmt::format("/proc/{}/stat", pid));
    auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent) out.push_back(pid);
  }
  ::closedir(proc);
  return out;
}

// The socket inodes a process holds open.
std::set<std::string> socketInodes(pid_t pid) {
  std::set<std::string> out;
  std::string dir = fmt::format("/proc/{}/fd", pid);
  DIR* fds = ::opendir(dir.c_str());
  if (!fds) return out;
  while (dirent* e = ::readdir(fds)) {
    char target[256] = {};
    ssize_t n = ::readlink((dir + "/" + e->d_name).c_str(), target, sizeof(target) - 1);
    std::string link(target, n > 0 ? static_cast<std::size_t>(n) : 0);
    if (link.rfind("socket:[", 0) == 0) out.insert(link.substr(8, link.size() - 9));
  }
  ::closedir(fds);
  return out;
}

struct Socket {
  std::string local;  // hex address:port, as /proc/net/tcp* writes it
  bool listening = false;
  bool loopback = false;
};

// Every TCP socket by inode, from /proc/net/tcp and tcp6.
std::map<std::string, Socket> tcpSockets() {
  std::map<std::string, Socket> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::istringstream lines(readBytes(table));
    std::string line;
    std::getline(lines, line);  // header
    while (std::getline(lines, line)) {
      std::istringstream f(line);
      std::string slot, local, remote, state, queues, timer, retr, uid, timeout, inode;
      f >> slot >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      std::string ip = local.substr(0, local.find(':'));
      bool loopback = false;
      if (ip.size() == 8) loopback = ip.substr(6, 2) == "7F";  // little-endian 127.x.x.x
      if (ip.size() == 32) {
        loopback = ip == "00000000000000000000000001000000" ||                 // ::1
                   (ip.substr(0, 24) == "0000000000000000FFFF0000" && ip.substr(30, 2) == "7F");  // ::ffff:127.x
      }
      out[inode] = Socket{local, state == "0A", loopback};
    }
  }
  return out;
}

RunSpec longRun() {
  RunSpec spec;
  spec.split = "num_stages: 2\n  policy: parameters";
  spec.steps = 100000;  // runs until the test is done with it
  spec.checkpoint_every = 0;
  spec.timeout_s = 20;
  return spec;
}

// Every TCP socket the ranks hold, listening or connected, is on loopback.
// (LibTorch 1.13's Gloo closes its listeners once the pairs are connected and
// the FileStore opens none, so there a run may have no listener at all.)
TEST(LocalRunSecurity, EverySocketListensOnLoopbackOnly) {
  TrainWorkspace ws;
  BackgroundRun run(ws.writeConfig("listen", longRun()), ws.dir() + "/listen.log");
  ASSERT_GT(run.pid(), 0);
  std::map<pid_t, std::map<std::string, Socket>> seen;  // rank pid -> its TCP sockets
  auto deadline = Clock::now() + 60s;
  std::optional<Clock::time_point> training_since;
  while (Clock::now() < deadline) {
    ASSERT_FALSE(run.wait(1ms).has_value()) << "the run ended early:\n" << run.output();
    auto all = tcpSockets();
    for (pid_t pid : childrenOf(run.pid())) {
      for (const std::string& inode : socketInodes(pid)) {
        if (all.count(inode)) seen[pid][inode] = all[inode];
      }
    }
    if (!training_since && run.output().find("  loss ") != std::string::npos) training_since = Clock::now();
    if (training_since && Clock::now() - *training_since > 2s) break;  // training, connections settled
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(training_since.has_value()) << run.output();
  ASSERT_EQ(seen.size(), 2u) << "expected to see both ranks' sockets (Gloo's pairs at least):\n" << run.output();
  int listening = 0, connected = 0;
  for (const auto& [pid, socks] : seen) {
    for (const auto& [inode, sock] : socks) {
      (sock.listening ? listening : connected) += 1;
      EXPECT_TRUE(sock.loopback) << "rank process " << pid << (sock.listening ? " listens" : " is connected")
                                 << " on " << sock.local << " (inode " << inode << "), not on loopback; store: "
                                 << (compat::storeBindsOneAddress() ? "TCPStore bound by us" : "FileStore");
    }
  }
  EXPECT_GT(connected, 0) << "the ranks' Gloo connections were not seen";
  std::cout << fmt::format("[ sockets ] {} listening and {} connected TCP sockets over 2 ranks, all loopback\n",
                           listening, connected);
}

std::string envOf(pid_t pid, const std::string& name) {
  std::string env = readBytes(fmt::format("/proc/{}/environ", pid));
  std::string key = name + "=";
  for (std::size_t at = 0; at < env.size();) {
    std::size_t end = env.find('\0', at);
    if (end == std::string::npos) end = env.size();
    if (env.compare(at, key.size(), key) == 0) return env.substr(at + key.size(), end - at - key.size());
    at = end + 1;
  }
  return "";
}

TEST(LocalRunSecurity, GarbageInTheStoreStopsTheRunNamingTheKey) {
  TrainWorkspace ws;
  RunSpec spec = longRun();
  BackgroundRun run(ws.writeConfig("garbage", spec), ws.dir() + "/garbage.log");
  ASSERT_GT(run.pid(), 0);
  // Wait for the ranks, then for training to start (the progress line).
  std::vector<pid_t> ranks;
  auto deadline = Clock::now() + 60s;
  while (Clock::now() < deadline && (ranks.size() < 2 || run.output().find("  loss ") == std::string::npos)) {
    ASSERT_FALSE(run.wait(1ms).has_value()) << "the run ended early:\n" << run.output();
    ranks = childrenOf(run.pid());
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_EQ(ranks.size(), 2u) << run.output();
  const std::string run_id = envOf(ranks[0], "PIPEFORGE_RUN_ID");
  ASSERT_FALSE(run_id.empty());
  compat::StoreEndpoint endpoint;
  endpoint.host = envOf(ranks[0], "MASTER_ADDR");
  endpoint.port = std::stoi(envOf(ranks[0], "MASTER_PORT"));
  endpoint.world_size = 2;
  endpoint.timeout = 10s;
  endpoint.private_dir = envOf(ranks[0], "PIPEFORGE_STORE_DIR");
  const std::string key = "pipeforge/run/" + run_id + "/abort";
  {
    auto store = compat::openStore(endpoint);
    const std::string garbage = "\x01\xff not a report {";
    store->set(key, std::vector<std::uint8_t>(garbage.begin(), garbage.end()));
  }
  auto status = run.wait(15s);
  ASSERT_TRUE(status.has_value()) << "the run did not stop within 15 s of the garbage:\n" << run.output();
  // A clean failure exit, not a crash: the store failed the run, a peer
  // failure (4, README "Exit statuses").
  EXPECT_EQ(*status, 4) << "a clean failure exit, not a crash:\n" << run.output();
  EXPECT_NE(run.output().find(key), std::string::npos) << run.output();
  EXPECT_NE(run.output().find("not a Pipeforge failure report"), std::string::npos) << run.output();
}

// Note [Fast stop]: a rank that dies before the process group forms does not
// leave the others waiting for distributed.timeout_s (here 20 s).
TEST(LocalRunFailure, ARankDyingBeforeTheGroupFormsStopsTheRestWithinFiveSeconds) {
  TrainWorkspace ws;
  BackgroundRun run(ws.writeConfig("early", longRun()), ws.dir() + "/early.log");
  ASSERT_GT(run.pid(), 0);
  std::vector<pid_t> ranks;
  auto deadline = Clock::now() + 30s;
  while (ranks.size() < 2 && Clock::now() < deadline) {
    ranks = childrenOf(run.pid());
    std::this_thread::sleep_for(2ms);
  }
  ASSERT_EQ(ranks.size(), 2u) << run.output();
  std::sort(ranks.begin(), ranks.end());  // forked in rank order
  ASSERT_EQ(::kill(ranks[1], SIGKILL), 0);
  const auto killed = Clock::now();
  auto status = run.wait(15s);
  const double seconds = std::chrono::duration<double>(Clock::now() - killed).count();
  ASSERT_TRUE(status.has_value()) << "still running 15 s after a rank died:\n" << run.output();
  EXPECT_EQ(*status, 4) << "a rank that died is a peer failure (Note [Run exit status]):\n" << run.output();
  EXPECT_LT(seconds, 5.0) << run.output();
  const std::string out = run.output();
  EXPECT_NE(out.find("rank 1: killed by signal 9"), std::string::npos) << out;
  EXPECT_EQ(out.find("are all ranks started with the same"), std::string::npos) << "a misleading first cause:\n" << out;
  std::cout << fmt::format("[ fast stop ] every rank gone {:.2f} s after rank 1 died\n", seconds);
}

}  // namespace
}  // namespace pipeforge::testing
