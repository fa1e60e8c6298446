#include "common/cpu_affinity.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace pipeforge {
namespace {

// A positive integer from the environment, or nullopt.
std::optional<int> positiveEnv(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  if (errno != 0 || *end != '\0' || n < 0 || n > 1 << 20) return std::nullopt;
  return static_cast<int>(n);
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

std::optional<std::vector<int>> rankCpuRange(const std::vector<int>& allowed, int local_rank, int local_world_size,
                                             int threads, std::string* why) {
  auto refuse = [&](std::string reason) -> std::optional<std::vector<int>> {
    if (why != nullptr) *why = std::move(reason);
    return std::nullopt;
  };
  if (local_world_size < 1 || local_rank < 0 || local_rank >= local_world_size || threads < 1) {
    return refuse("no valid local rank");
  }
  const long need = static_cast<long>(local_world_size) * threads;
  if (need > static_cast<long>(allowed.size())) {
    return refuse(std::to_string(local_world_size) + " ranks x " + std::to_string(threads) + " threads need " +
                  std::to_string(need) + " CPUs, " + std::to_string(allowed.size()) + " usable");
  }
  const auto first = allowed.begin() + static_cast<long>(local_rank) * threads;
  return std::vector<int>(first, first + threads);
}

CpuPinning pinRankToCpus() {
  CpuPinning out;
  const std::optional<int> local_ranks = positiveEnv("LOCAL_WORLD_SIZE");
  const std::optional<int> local_rank = positiveEnv("LOCAL_RANK");
  if (!local_ranks || !local_rank) {
    out.reason = "LOCAL_RANK / LOCAL_WORLD_SIZE unset";
    return out;
  }
  const std::vector<int> allowed = allowedCpus();
  int threads = positiveEnv("OMP_NUM_THREADS").value_or(0);
  if (threads == 0) threads = std::max<int>(1, static_cast<int>(allowed.size()) / std::max(1, *local_ranks));
  const std::optional<std::vector<int>> range = rankCpuRange(allowed, *local_rank, *local_ranks, threads, &out.reason);
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

}  // namespace pipeforge
