// The runtime over real processes and Gloo: runtime_worker started as N
// ranks by the local launcher.
#include <gtest/gtest.h>

#include "runtime/local_launcher.h"
#include "schedules/generate.h"
#include "tests/support/build_paths.h"

namespace pipeforge::runtime {
namespace {

LaunchResult launch(std::vector<std::string> args, int ranks, std::chrono::seconds grace) {
  LaunchOptions o;
  o.executable = PIPEFORGE_RUNTIME_WORKER;
  o.args = std::move(args);
  o.num_ranks = ranks;
  o.grace = grace;
  o.timeout = std::chrono::minutes(4);
  o.env = {{"OMP_NUM_THREADS", "1"}};
  return launchLocal(o);
}

class AcceptanceOnGloo : public ::testing::TestWithParam<int> {};

TEST_P(AcceptanceOnGloo, LossesAndGradientsMatchSingleProcess) {
  LaunchResult r = launch({"accept", PIPEFORGE_RUNTIME_SPLITS}, GetParam(), std::chrono::seconds(30));
  EXPECT_TRUE(r.ok()) << r.summary();
  for (const RankExit& rank : r.ranks) {
    // testing::acceptanceCases: 3 models x every named schedule.
    const std::size_t cases = 3 * schedules::scheduleNames().size();
    std::size_t oks = 0;
    for (std::size_t p = rank.output.find(": ok on rank"); p != std::string::npos; p = rank.output.find(": ok on rank", p + 1)) ++oks;
    EXPECT_EQ(oks, cases) << "rank " << rank.rank << ":\n" << rank.output;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, AcceptanceOnGloo, ::testing::Values(2, 4));

// A rank that fails mid-step: every rank must stop by itself, well before the
// launcher's grace runs out, naming the failed rank, its action and the grid.
void expectEveryRankStops(const LaunchResult& r, int failed, bool died) {
  for (const RankExit& rank : r.ranks) {
    SCOPED_TRACE("rank " + std::to_string(rank.rank) + " output:\n" + rank.output);
    EXPECT_FALSE(rank.ok());
    EXPECT_FALSE(rank.killed_by_launcher);
    EXPECT_LT(rank.seconds, 20.0);
    if (rank.rank == failed) continue;
    EXPECT_NE(rank.output.find("rank " + std::to_string(failed)), std::string::npos);
    if (!died) {
      EXPECT_NE(rank.output.find("injected failure"), std::string::npos);
      EXPECT_NE(rank.output.find("<-- ERROR HERE"), std::string::npos);
    }
  }
}

TEST(FailureOnGloo, AThrowingRankStopsAllWithItsReport) {
  LaunchResult r = launch({"fail", PIPEFORGE_RUNTIME_SPLITS, "2", "throw"}, 4, std::chrono::seconds(40));
  expectEveryRankStops(r, 2, false);
}

TEST(FailureOnGloo, ADeadRankStopsAllNamingIt) {
  LaunchResult r = launch({"fail", PIPEFORGE_RUNTIME_SPLITS, "1", "die"}, 4, std::chrono::seconds(40));
  expectEveryRankStops(r, 1, true);
}

}  // namespace
}  // namespace pipeforge::runtime
