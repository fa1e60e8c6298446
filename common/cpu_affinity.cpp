#include "common/cpu_affinity.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

namespace pipeforge {
namespace {

// A non-negative integer from the environment, or nullopt.
std::optional<int> envInt(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  if (errno != 0 || *end != '\0' || n < 0 || n > 1 << 20) return std::nullopt;
  return static_cast<int>(n);
}

// The folder every Pipeforge process of the host takes its CPU locks in:
// sticky and writable by all, as /tmp is, so users share it.
std::string lockDir() {
  if (const char* d = std::getenv("PIPEFORGE_CPU_LOCK_DIR"); d != nullptr && *d != '\0') return d;
  std::error_code ec;
  const std::string base = std::filesystem::is_directory("/dev/shm", ec)
                               ? std::string("/dev/shm")
                               : std::filesystem::temp_directory_path(ec).string();
  return base + "/pipeforge-cpus";
}

// An fd holding the lock of `cpu`, or -1 when another reservation holds it
// (or the lock cannot be made: `err` says so).
int lockCpu(const std::string& dir, int cpu, std::string* err) {
  const std::string path = dir + "/cpu" + std::to_string(cpu) + ".lock";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd >= 0) {
    ::fchmod(fd, 0666);  // past the umask, for the host's other users (not ours to refuse)
  } else {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);  // another user's file: a read fd can flock
  }
  if (fd < 0) {
    *err = path + ": " + std::strerror(errno);
    return -1;
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) *err = path + ": flock: " + std::strerror(errno);
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

std::vector<int> allowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  return out;
}

std::optional<std::vector<int>> rankCpuRange(const std::vector<int>& cpus, int local_rank, int local_world_size,
                                             int threads, std::string* why) {
  auto refuse = [&](std::string reason) -> std::optional<std::vector<int>> {
    if (why != nullptr) *why = std::move(reason);
    return std::nullopt;
  };
  if (local_world_size < 1 || local_rank < 0 || local_rank >= local_world_size || threads < 1) {
    return refuse("no valid local rank");
  }
  const long need = static_cast<long>(local_world_size) * threads;
  if (need > static_cast<long>(cpus.size())) {
    return refuse(std::to_string(local_world_size) + " ranks x " + std::to_string(threads) + " threads need " +
                  std::to_string(need) + " CPUs, " + std::to_string(cpus.size()) + " usable");
  }
  const auto first = cpus.begin() + static_cast<long>(local_rank) * threads;
  return std::vector<int>(first, first + threads);
}

std::string cpuListText(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

std::optional<std::vector<int>> parseCpuList(std::string_view text) {
  std::vector<int> out;
  if (text.empty()) return out;
  auto number = [](std::string_view s) -> std::optional<int> {
    if (s.empty() || s.size() > 6 || s.find_first_not_of("0123456789") != std::string_view::npos) return std::nullopt;
    return std::stoi(std::string(s));
  };
  while (!text.empty()) {
    const std::size_t comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (comma != std::string_view::npos && text.empty()) return std::nullopt;  // "1,"
    const std::size_t dash = item.find('-');
    const auto lo = number(item.substr(0, dash));
    const auto hi = dash == std::string_view::npos ? lo : number(item.substr(dash + 1));
    if (!lo || !hi || *hi < *lo) return std::nullopt;
    for (int c = *lo; c <= *hi; ++c) out.push_back(c);
  }
  return out;
}

CpuReservation CpuReservation::take(const std::vector<int>& allowed, int count) {
  CpuReservation r;
  if (count < 1 || count > static_cast<int>(allowed.size())) {
    r.reason_ = std::to_string(count) + " CPUs needed, " + std::to_string(allowed.size()) + " usable";
    return r;
  }
  const std::string dir = lockDir();
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    if (::mkdir(dir.c_str(), 01777) == 0) ::chmod(dir.c_str(), 01777);
  }
  std::vector<int> taken_by_others;
  std::string err;
  for (int cpu : allowed) {
    if (static_cast<int>(r.cpus_.size()) == count) break;
    const int fd = lockCpu(dir, cpu, &err);
    if (fd >= 0) {
      r.cpus_.push_back(cpu);
      r.fds_.push_back(fd);
    } else if (!err.empty()) {
      break;
    } else {
      taken_by_others.push_back(cpu);
    }
  }
  if (static_cast<int>(r.cpus_.size()) < count) {
    r.release();
    r.reason_ = !err.empty() ? "cannot lock a CPU: " + err
                             : std::to_string(count) + " CPUs needed, but other Pipeforge runs hold CPUs " +
                                   cpuListText(taken_by_others) + " of the " + std::to_string(allowed.size()) +
                                   " usable";
  }
  return r;
}

CpuReservation::CpuReservation(CpuReservation&& other) noexcept
    : cpus_(std::move(other.cpus_)), fds_(std::move(other.fds_)), reason_(std::move(other.reason_)) {
  other.fds_.clear();
  other.cpus_.clear();
}

CpuReservation& CpuReservation::operator=(CpuReservation&& other) noexcept {
  if (this != &other) {
    release();
    cpus_ = std::move(other.cpus_);
    fds_ = std::move(other.fds_);
    reason_ = std::move(other.reason_);
    other.fds_.clear();
    other.cpus_.clear();
  }
  return *this;
}

CpuReservation::~CpuReservation() { release(); }

void CpuReservation::release() {
  for (int fd : fds_) ::close(fd);  // closing drops the flock
  fds_.clear();
  cpus_.clear();
}

CpuPinning pinRankToCpus() {
  CpuPinning out;
  const char* list = std::getenv(kRankCpusVariable);
  if (list == nullptr) {
    out.reason = "not started by pipeforge train --nproc (one process, or ranks torchrun or srun placed)";
    return out;
  }
  const std::optional<std::vector<int>> reserved = parseCpuList(list);
  if (!reserved || reserved->empty()) {
    const char* why = std::getenv(kRankCpusReasonVariable);
    out.reason = why != nullptr && *why != '\0' ? why : std::string("the launcher reserved no CPUs");
    return out;
  }
  const std::optional<int> local_ranks = envInt("LOCAL_WORLD_SIZE");
  const std::optional<int> local_rank = envInt("LOCAL_RANK");
  if (!local_ranks || !local_rank) {
    out.reason = "LOCAL_RANK / LOCAL_WORLD_SIZE unset";
    return out;
  }
  const int threads = std::max(1, static_cast<int>(reserved->size()) / std::max(1, *local_ranks));
  const std::optional<std::vector<int>> range =
      rankCpuRange(*reserved, *local_rank, *local_ranks, threads, &out.reason);
  if (!range) return out;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : *range) CPU_SET(c, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    out.reason = std::string("sched_setaffinity: ") + std::strerror(errno);
    return out;
  }
  out.cpus = *range;
  return out;
}

}  // namespace pipeforge
