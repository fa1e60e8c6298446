// Note [One core range per rank], end to end: `pipeforge train --nproc 2`
// on the CPU reserves a share of the usable CPUs per rank and pins rank 0
// to the first, saying so in the start record; a run that finds the CPUs
// held by another run pins nothing and says why; `distributed.cpu_affinity:
// none` leaves the ranks to the kernel; and the trained parameters do not
// depend on any of it. The reservations live in a folder of this test's own.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/cpu_affinity.h"
#include "tests/train/train_fixture.h"

namespace pipeforge::testing {
namespace {

nlohmann::json startRecord(const std::string& metrics) {
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    if (j.value("event", "") == "start") return j;
  }
  return nullptr;
}

TEST(CpuAffinityE2E, RanksRunOnReservedCpusAndSaySo) {
  TrainWorkspace ws;
  ::setenv("PIPEFORGE_CPU_LOCK_DIR", ws.dir().c_str(), 1);
  const std::vector<int> allowed = allowedCpus();
  // The threads per rank the launcher gives 2 ranks (Note [Threads per rank]).
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const int threads =
      omp != nullptr ? std::atoi(omp) : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / 2);

  RunSpec s;
  s.model = "mlp";
  s.split = "num_stages: 2\n  policy: parameters";
  s.steps = 2;
  auto train = [&](const std::string& name) {
    auto run = runPipeforge(fmt::format("train --config '{}' --nproc 2", ws.writeConfig(name, s)));
    EXPECT_EQ(run.exit_code, 0) << run.output;
    return startRecord(ws.outDir(name) + "/metrics.jsonl");
  };
  const nlohmann::json pinned = train("pinned");
  {
    // Another run holds every CPU.
    const CpuReservation other = CpuReservation::take(allowed, static_cast<int>(allowed.size()));
    ASSERT_EQ(other.cpus(), allowed);
    const nlohmann::json taken = train("taken");
    ASSERT_TRUE(taken.contains("cpu_affinity")) << taken.dump();
    EXPECT_EQ(taken["cpu_affinity"]["cpus"], "") << taken.dump();
    EXPECT_NE(taken["cpu_affinity"]["reason"].get<std::string>().find("other Pipeforge runs hold CPUs " +
                                                                       cpuListText(allowed)),
              std::string::npos)
        << taken.dump();
  }
  s.distributed = ", cpu_affinity: none";
  const nlohmann::json unpinned = train("unpinned");
  ::unsetenv("PIPEFORGE_CPU_LOCK_DIR");

  ASSERT_TRUE(pinned.contains("cpu_affinity")) << pinned.dump();
  if (2 * threads <= static_cast<int>(allowed.size())) {
    EXPECT_EQ(pinned["cpu_affinity"]["cpus"], cpuListText(*rankCpuRange(allowed, 0, 2, threads))) << pinned.dump();
    EXPECT_EQ(pinned["cpu_affinity"]["reason"], "") << pinned.dump();
  } else {
    EXPECT_EQ(pinned["cpu_affinity"]["cpus"], "") << pinned.dump();
    EXPECT_EQ(pinned["cpu_affinity"]["reason"], fmt::format("{} CPUs needed, {} usable", 2 * threads, allowed.size()))
        << pinned.dump();
  }
  ASSERT_TRUE(unpinned.is_object());
  EXPECT_FALSE(unpinned.contains("cpu_affinity")) << unpinned.dump();

  // Where the ranks run does not change what they compute.
  const auto a = exportedParameters(ws.checkpointDir("pinned"), zooModelPath("mlp"), ws.dir() + "/a.pt");
  const auto b = exportedParameters(ws.checkpointDir("unpinned"), zooModelPath("mlp"), ws.dir() + "/b.pt");
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(mismatches(a, b, 0.0, 0.0).empty());
}

}  // namespace
}  // namespace pipeforge::testing
