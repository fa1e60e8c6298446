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
// (gpt_demo, 1F1B, 2 ranks on 2 cores) every F and B took longer than the
// same action in one process, and the two-rank step was 58.6-63.3 ms; with
// one core per rank it was 50.7-54.8 ms (bench/runtime_bench.cpp prints both).
//
// So, unless `distributed.cpu_affinity: none`, a rank on the CPU device
// takes its own T of the CPUs this process may use (sched_getaffinity: what
// taskset, a cgroup or the batch system left it), in order: local rank r
// gets the r-th T of them. Threads started later (ATen's pool, Gloo's
// transport) inherit the range. Nothing is pinned, and the reason is kept,
// where pinning would be wrong:
//   - the ranks do not fit: N*T above the usable CPUs (4 ranks on 2 cores:
//     pinning would only fix which ranks share a core);
//   - the host's rank count is unknown: no LOCAL_WORLD_SIZE (our launcher
//     and torchrun set it; SLURM's srun binds its tasks itself, --cpu-bind);
//   - the device is a GPU (its ranks feed kernels, and their placement
//     follows the GPU's NUMA node, which this does not know).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace pipeforge {

// The CPUs this process may run on, ascending.
std::vector<int> allowedCpus();

// The CPUs of local rank `local_rank` of `local_world_size`, `threads` each,
// taken in order from `allowed`; nullopt (and `why`) when they do not fit.
std::optional<std::vector<int>> rankCpuRange(const std::vector<int>& allowed, int local_rank, int local_world_size,
                                             int threads, std::string* why = nullptr);

struct CpuPinning {
  std::vector<int> cpus;  // the CPUs this process now runs on; empty: left as it was
  std::string reason;     // why it was left, when it was
};

// Pins this process's calling thread (and every thread it starts later) to
// its range, from LOCAL_RANK, LOCAL_WORLD_SIZE and OMP_NUM_THREADS (unset:
// the usable CPUs shared out, as our launcher shares them). Call it before
// any thread pool starts. Never throws: a failure is a reason.
CpuPinning pinRankToCpus();

// "0-3", "0,2,5": the CPU list as taskset and /proc show it.
std::string cpuListText(const std::vector<int>& cpus);

}  // namespace pipeforge
