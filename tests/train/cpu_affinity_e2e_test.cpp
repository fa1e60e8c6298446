// Note [One core range per rank], end to end: `pipeforge train --nproc 2`
// on the CPU pins rank 0 to the first share of the usable CPUs and says so
// in the start record; `distributed.cpu_affinity: none` leaves the ranks to
// the kernel; ranks that do not fit are left, with the reason; and the
// trained parameters do not depend on it.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

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

// The threads per rank the launcher gives `ranks` ranks (Note [Threads per rank]).
int threadsPerRank(int ranks, const std::vector<int>& allowed) {
  if (const char* t = std::getenv("OMP_NUM_THREADS")) return std::atoi(t);
  return std::max(1, static_cast<int>(allowed.size()) / ranks);
}

TEST(CpuAffinityE2E, RankZeroRunsOnTheFirstShareAndSaysSo) {
  const std::vector<int> allowed = allowedCpus();
  TrainWorkspace ws;
  RunSpec s;
  s.model = "mlp";
  s.split = "num_stages: 2\n  policy: parameters";
  s.steps = 2;
  const std::string pinned = ws.writeConfig("pinned", s);
  s.distributed = ", cpu_affinity: none";
  const std::string unpinned = ws.writeConfig("unpinned", s);
  for (const std::string& name : {"pinned", "unpinned"}) {
    auto run = runPipeforge(fmt::format("train --config '{}' --nproc 2", ws.dir() + "/" + name + ".yaml"));
    ASSERT_EQ(run.exit_code, 0) << run.output;
  }
  const nlohmann::json on = startRecord(ws.outDir("pinned") + "/metrics.jsonl");
  ASSERT_TRUE(on.is_object());
  ASSERT_TRUE(on.contains("cpu_affinity")) << on.dump();
  const int threads = threadsPerRank(2, allowed);
  std::string why;
  const auto want = rankCpuRange(allowed, 0, 2, threads, &why);
  if (want) {
    EXPECT_EQ(on["cpu_affinity"]["cpus"], cpuListText(*want)) << on.dump();
    EXPECT_EQ(on["cpu_affinity"]["reason"], "") << on.dump();
  } else {
    EXPECT_EQ(on["cpu_affinity"]["cpus"], "") << on.dump();
    EXPECT_EQ(on["cpu_affinity"]["reason"], why) << on.dump();
  }
  const nlohmann::json off = startRecord(ws.outDir("unpinned") + "/metrics.jsonl");
  ASSERT_TRUE(off.is_object());
  EXPECT_FALSE(off.contains("cpu_affinity")) << off.dump();

  // Where the ranks run does not change what they compute.
  const auto a = exportedParameters(ws.checkpointDir("pinned"), zooModelPath("mlp"), ws.dir() + "/a.pt");
  const auto b = exportedParameters(ws.checkpointDir("unpinned"), zooModelPath("mlp"), ws.dir() + "/b.pt");
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(mismatches(a, b, 0.0, 0.0).empty());
}

}  // namespace
}  // namespace pipeforge::testing
