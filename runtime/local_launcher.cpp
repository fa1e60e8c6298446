#include "runtime/local_launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "common/interrupt.h"

extern char** environ;

namespace pipeforge::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// The OMP_NUM_THREADS the user chose for the ranks, if any.
const char* userThreads(const LaunchOptions& o) {
  for (const auto& [name, value] : o.env) {
    if (name == "OMP_NUM_THREADS") return value.c_str();
  }
  return std::getenv("OMP_NUM_THREADS");
}

// The environment of one rank: ours, minus what we set, plus what we set.
std::vector<std::string> rankEnv(const LaunchOptions& o, int rank, int port, const std::string& run_id,
                                 const std::string& private_dir) {
  std::vector<std::pair<std::string, std::string>> set = {
      {"PIPEFORGE_RUN_ID", run_id},
      {"PIPEFORGE_STORE_DIR", private_dir},
      {"RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(o.num_ranks)},
      {"LOCAL_RANK", std::to_string(rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.num_ranks)},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(port)},
  };
  // Note [Threads per rank]: N ranks on one host each default to every core,
  // which oversubscribes it N times over (torchrun sets 1). Unless the user
  // chose, each rank gets its share of the cores.
  if (!userThreads(o)) set.emplace_back("OMP_NUM_THREADS", std::to_string(threadsPerRank(o)));
  set.insert(set.end(), o.env.begin(), o.env.end());
  std::vector<std::string> out;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    std::string name = entry.substr(0, entry.find('='));
    bool overridden = false;
    for (const auto& [k, v] : set) overridden |= k == name;
    if (!overridden) out.push_back(entry);
  }
  for (const auto& [k, v] : set) out.push_back(k + "=" + v);
  return out;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string lastLines(const std::string& text, int n) {
  std::size_t pos = text.size();
  while (n-- > 0 && pos > 0) {
    pos = text.rfind('\n', pos - 1);
    if (pos == std::string::npos) return text;
  }
  return text.substr(pos + 1);
}

// 12 hex digits from the kernel's random pool: unique among concurrent runs.
std::string freshRunId() {
  unsigned char bytes[6] = {};
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  urandom.read(reinterpret_cast<char*>(bytes), sizeof(bytes));
  std::string id = "pf-";
  for (unsigned char b : bytes) id += fmt::format("{:02x}", b);
  return id;
}

std::string makePrivateDir(const std::string& prefix) {
  std::string tmpl = prefix + "XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {  // mode 0700
    throw LaunchError(fmt::format("cannot make a folder {}: {}", tmpl, std::strerror(errno)));
  }
  return tmpl;
}

// Note [Launch folders]: a launcher holds an flock on `<folder>/owner` for
// as long as it runs; the RemovedOnReturn below removes the folder when it
// returns. One killed with SIGKILL cannot, so each launch first removes the
// folders under `prefix` whose owner lock it can take (their launcher is
// gone; the lock cannot outlive it, whatever reuses its pid). A folder
// without the file is left alone: its launcher may not have taken it yet.
// The file is locked as `owner.tmp` and only then renamed to `owner`, so an
// `owner` that a sweep can see is always locked while its launcher lives: a
// sweep can never slip in between the file's creation and its lock.
int holdOwnerLock(const std::string& dir) {
  const std::string tmp = dir + "/owner.tmp";
  const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0 || ::rename(tmp.c_str(), (dir + "/owner").c_str()) != 0) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return -1;
  }
  return fd;
}

}  // namespace

void removeAbandonedLaunchFolders(const std::string& prefix) {
  const std::filesystem::path pattern(prefix);
  const std::string stem = pattern.filename().string();
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(pattern.parent_path(), ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(stem, 0) != 0 || !entry.is_directory(ec)) continue;
    const std::string owner = entry.path().string() + "/owner";
    struct stat st {};
    if (::stat(owner.c_str(), &st) != 0 || st.st_uid != ::geteuid()) continue;
    const int fd = ::open(owner.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) std::filesystem::remove_all(entry.path(), ec);
    ::close(fd);
  }
}

int findFreePort(const std::string& addr) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw LaunchError(fmt::format("socket() failed: {}", std::strerror(errno)));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = 0;
  if (::inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1) sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    ::close(fd);
    throw LaunchError(fmt::format("cannot bind a free port on {}: {}", addr, std::strerror(errno)));
  }
  socklen_t len = sizeof(sa);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  ::close(fd);
  return ntohs(sa.sin_port);
}

// Note [Run exit status]: a rank that only saw another rank fail exits with
// kPeerFailure's status (4, Note [Error codes]), and it may exit before the
// rank that caused it. So the run's status is that of the first rank, in exit
// order, that exited by itself with any other non-zero status: the cause
// (1 for a bad config, 3 for a failed write, ...). A rank ended by a signal,
// or by the launcher, and a run where every rank says "peer failure", give 4.
std::optional<int> LaunchResult::causeRank() const {
  if (ok()) return std::nullopt;
  const int peer = exitStatusFor(ErrorCode::kPeerFailure);
  std::vector<const RankExit*> exited;
  for (const RankExit& r : ranks) {
    if (!r.ok() && r.signal == 0 && !r.killed_by_launcher && r.exit_code != peer) exited.push_back(&r);
  }
  if (exited.empty()) return first_failed;
  return (*std::min_element(exited.begin(), exited.end(), [](const RankExit* a, const RankExit* b) {
           return a->seconds < b->seconds;
         }))->rank;
}

int LaunchResult::exitStatus() const {
  if (ok()) return 0;
  const RankExit& cause = ranks[*causeRank()];
  const int peer = exitStatusFor(ErrorCode::kPeerFailure);
  return cause.signal == 0 && !cause.killed_by_launcher && cause.exit_code != peer ? cause.exit_code : peer;
}

int LaunchResult::interruptedStatus() const {
  if (ranks.empty()) return 0;
  for (const RankExit& r : ranks) {
    if (r.signal != 0 || r.exit_code != ranks.front().exit_code) return 0;
  }
  return isInterruptedExitStatus(ranks.front().exit_code) ? ranks.front().exit_code : 0;
}

std::string LaunchResult::summary() const {
  std::string out;
  for (const RankExit& r : ranks) {
    std::string how = r.signal != 0 ? fmt::format("killed by signal {}", r.signal) : fmt::format("exit {}", r.exit_code);
    out += fmt::format("rank {}: {} after {:.1f} s{}\n", r.rank, how, r.seconds,
                       r.killed_by_launcher ? " (stopped by the launcher)" : "");
  }
  if (const std::optional<int> cause = causeRank()) {
    const RankExit& r = ranks[*cause];
    out += r.rank == *first_failed ? fmt::format("rank {} failed first", r.rank)
                                   : fmt::format("rank {} failed first (rank {}, which only saw it fail, exited "
                                                 "sooner)",
                                                 r.rank, *first_failed);
    if (!r.output.empty()) out += "; its last output:\n" + lastLines(r.output, 30);
    if (!out.empty() && out.back() != '\n') out += "\n";
  }
  return out;
}

namespace {

// Starts rank 0..num_ranks-1 as children, each with its environment and,
// when captured, its output in <log_dir>/rank<R>.log; returns their pids.
std::vector<pid_t> forkRanks(const LaunchOptions& o, const LaunchResult& result, const std::string& private_dir,
                             const std::string& log_dir) {
  // Everything the children need is built before fork: after it, a child of
  // a threaded parent may only make async-signal-safe calls.
  std::vector<std::string> argv_text{o.executable};
  argv_text.insert(argv_text.end(), o.args.begin(), o.args.end());
  std::vector<char*> argv;
  for (auto& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);

  std::vector<pid_t> pids(o.num_ranks, -1);
  for (int rank = 0; rank < o.num_ranks; ++rank) {
    std::vector<std::string> env_text = rankEnv(o, rank, result.master_port, result.run_id, private_dir);
    std::vector<char*> envp;
    for (auto& e : env_text) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string log = o.capture_output ? fmt::format("{}/rank{}.log", log_dir, rank) : std::string();
    int log_fd = -1;
    if (!log.empty()) log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) throw LaunchError(fmt::format("fork failed: {}", std::strerror(errno)));
    if (pid == 0) {
      // Dies with the launcher, so a killed test leaves no stray ranks.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      if (log_fd >= 0) {
        ::dup2(log_fd, STDOUT_FILENO);
        ::dup2(log_fd, STDERR_FILENO);
      }
      ::execve(o.executable.c_str(), argv.data(), envp.data());
      ::_exit(127);
    }
    if (log_fd >= 0) ::close(log_fd);
    pids[rank] = pid;
  }
  return pids;
}

// Waits for every rank, recording how each ended. Relays an interrupt to
// the ranks once (Note [Graceful interrupts]); after the first failure the
// others get o.grace to stop by themselves, then are killed (Note [Fast
// stop]), as are all of them at o.timeout.
void superviseRanks(const LaunchOptions& o, std::vector<pid_t>& pids, Clock::time_point start, LaunchResult& result) {
  int running = o.num_ranks;
  bool relayed = false;
  std::optional<Clock::time_point> kill_at;
  auto deadline = start + o.timeout;
  while (running > 0) {
    bool reaped = false;
    for (int rank = 0; rank < o.num_ranks; ++rank) {
      if (pids[rank] < 0) continue;
      int status = 0;
      pid_t got = ::waitpid(pids[rank], &status, WNOHANG);
      if (got != pids[rank]) continue;
      reaped = true;
      RankExit& r = result.ranks[rank];
      r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
      if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
      pids[rank] = -1;
      --running;
      if (!r.ok() && !isInterruptedExitStatus(r.exit_code) && !result.first_failed) {
        result.first_failed = rank;
        kill_at = Clock::now() + o.grace;
      }
    }
    if (const int signal = interruptSignal(); signal != 0 && !relayed) {
      for (int rank = 0; rank < o.num_ranks; ++rank) {
        if (pids[rank] > 0) ::kill(pids[rank], signal);
      }
      relayed = true;
    }
    auto now = Clock::now();
    if ((kill_at && now >= *kill_at) || now >= deadline) {
      for (int rank = 0; rank < o.num_ranks; ++rank) {
        if (pids[rank] < 0) continue;
        ::kill(pids[rank], SIGKILL);
        result.ranks[rank].killed_by_launcher = true;
      }
      kill_at.reset();
      deadline = now + std::chrono::hours(1);  // reap the killed ones
    }
    if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!result.first_failed) {
    for (const RankExit& r : result.ranks) {
      if (!r.ok()) {
        result.first_failed = r.rank;
        break;
      }
    }
  }
}

}  // namespace

int threadsPerRank(const LaunchOptions& options) {
  if (const char* chosen = userThreads(options)) {
    const int threads = std::atoi(chosen);
    if (threads >= 1) return threads;
  }
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, options.num_ranks));
}

LaunchResult launchLocal(const LaunchOptions& o) {
  if (o.num_ranks < 1) {
    throw LaunchError(fmt::format("num_ranks is {}; launch at least one rank", o.num_ranks), ErrorCode::kUserInput);
  }
  if (::access(o.executable.c_str(), X_OK) != 0) {
    throw LaunchError(fmt::format("cannot run '{}': {}", o.executable, std::strerror(errno)));
  }
  LaunchResult result;
  result.master_port = o.master_port.value_or(findFreePort(o.master_addr));
  result.run_id = o.run_id.empty() ? freshRunId() : o.run_id;

  // Logs and the private store folder of this run; removed at the end, or
  // by a later launch if this one is killed (Note [Launch folders]).
  removeAbandonedLaunchFolders(kLaunchFolderPrefix);
  const std::string run_dir = makePrivateDir(kLaunchFolderPrefix);
  struct RemovedOnReturn {  // also when a rank's failure ends the run with an exception
    std::string dir;
    int owner_fd = -1;
    ~RemovedOnReturn() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
      if (owner_fd >= 0) ::close(owner_fd);
    }
  } removed{run_dir, holdOwnerLock(run_dir)};
  const std::string private_dir = run_dir + "/store";
  if (::mkdir(private_dir.c_str(), 0700) != 0) {
    throw LaunchError(fmt::format("cannot make a folder {}: {}", private_dir, std::strerror(errno)));
  }
  const std::string log_dir = o.capture_output ? run_dir : std::string();

  result.ranks.resize(o.num_ranks);
  for (int rank = 0; rank < o.num_ranks; ++rank) result.ranks[rank].rank = rank;
  const auto start = Clock::now();
  std::vector<pid_t> pids = forkRanks(o, result, private_dir, log_dir);
  superviseRanks(o, pids, start, result);
  if (o.capture_output) {
    for (int rank = 0; rank < o.num_ranks; ++rank) {
      result.ranks[rank].output = readFile(fmt::format("{}/rank{}.log", log_dir, rank));
    }
  }
  return result;
}

}  // namespace pipeforge::runtime
