// Which CPUs a training rank runs on (Note [One core range per rank]).
//
// Note [One core range per rank]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// N ranks on one host, T intra-op threads each (Note [Threads per rank] in
// runtime/local_launcher.cpp), leave it to the kernel's scheduler to place
// N*T busy threads. A pipeline rank blocks on a peer at every receive, and
// the scheduler wakes it on whichever core is free then: its stage's weights
// and activations stay behind in the other core's cache, and its transport
// thread lands beside the other rank's compute. On the runtime bench
// (gpt_demo, 1F1B, 2 ranks on 2 cores) the two-rank step was 61.2-63.8 ms
// left to the scheduler and 53.5-58.7 ms with a core per rank
// (bench/runtime_bench.cpp measures both).
//
// So `pipeforge train --nproc N` on the CPU device (distributed.cpu_affinity:
// auto, the default) reserves N*T of the CPUs it may use (sched_getaffinity:
// what taskset, a cgroup or the batch system left it) for as long as the run
// lasts, and local rank r runs on the r-th T of them; the threads a rank
// starts later (ATen's pool, Gloo's transport) inherit its range. A
// reservation is a flock on one file per CPU in a folder every Pipeforge
// process of the host shares (/dev/shm/pipeforge-cpus; PIPEFORGE_CPU_LOCK_DIR
// moves it), so two runs on one host take different CPUs, and a run that
// finds too few free pins nothing rather than stacking its ranks on
// another run's. Nothing is pinned, and the start record says why, when:
//   - the ranks do not fit: N*T above the usable CPUs (4 ranks on 2 cores);
//   - other Pipeforge runs hold the CPUs it would need;
//   - the ranks were not started by our launcher: torchrun and srun place
//     ranks themselves (srun --cpu-bind; torchrun's own options);
//   - the device is a GPU (its ranks feed kernels, and their placement
//     follows the GPU's NUMA node, which this does not know);
//   - distributed.cpu_affinity: none.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pipeforge {

// The CPUs this process may run on, ascending.
std::vector<int> allowedCpus();

// The CPUs of local rank `local_rank` of `local_world_size`, `threads` each,
// taken in order from `cpus`; nullopt (and `why`) when they do not fit.
std::optional<std::vector<int>> rankCpuRange(const std::vector<int>& cpus, int local_rank, int local_world_size,
                                             int threads, std::string* why = nullptr);

// "0-3", "0,2,5-7": a CPU list as taskset and /proc write it, and back.
std::string cpuListText(const std::vector<int>& cpus);
std::optional<std::vector<int>> parseCpuList(std::string_view text);

// CPUs held for one run until destroyed (the flocks above). Move-only.
class CpuReservation {
 public:
  // The first `count` CPUs of `allowed` no other reservation holds; none
  // (with reason()) when fewer are free or `count` exceeds `allowed`.
  static CpuReservation take(const std::vector<int>& allowed, int count);

  CpuReservation() = default;
  CpuReservation(CpuReservation&& other) noexcept;
  CpuReservation& operator=(CpuReservation&& other) noexcept;
  CpuReservation(const CpuReservation&) = delete;
  CpuReservation& operator=(const CpuReservation&) = delete;
  ~CpuReservation();

  const std::vector<int>& cpus() const { return cpus_; }  // empty: none held
  const std::string& reason() const { return reason_; }   // why none, when none

 private:
  void release();
  std::vector<int> cpus_;
  std::vector<int> fds_;
  std::string reason_;
};

// The variables a launcher sets for its ranks: the reserved CPUs (their
// list, or empty), and why there are none.
inline constexpr const char* kRankCpusVariable = "PIPEFORGE_RANK_CPUS";
inline constexpr const char* kRankCpusReasonVariable = "PIPEFORGE_RANK_CPUS_REASON";

struct CpuPinning {
  std::vector<int> cpus;  // the CPUs this process now runs on; empty: left as it was
  std::string reason;     // why it was left, when it was
};

// In a rank: pins the calling thread (and every thread it starts later) to
// its share of the launcher's reservation, from PIPEFORGE_RANK_CPUS,
// LOCAL_RANK, LOCAL_WORLD_SIZE and OMP_NUM_THREADS. Call it before any
// thread pool starts. Never throws: a failure is a reason.
CpuPinning pinRankToCpus();

}  // namespace pipeforge
