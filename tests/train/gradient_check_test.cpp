// Note [One collective per step's checks]: the flags each rank contributes
// to the all-reduce after a backward, and what every rank reads from their sum.
#include "train/gradient_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <limits>

namespace pipeforge::train {
namespace {

// The all-reduce: element-wise sums of every rank's flags.
GradientCheck sumAndDecode(std::vector<GradientCheckFlags> ranks) {
  GradientCheckFlags total = ranks.front();
  for (std::size_t r = 1; r < ranks.size(); ++r) {
    for (std::size_t k = 0; k < total.values().size(); ++k) total.values()[k] += ranks[r].values()[k];
  }
  return total.decode();
}

TEST(GradientCheckFlags, LayoutIsStageNormsThenLossNormAndSignals) {
  GradientCheckFlags flags(2);
  flags.addStageNorm2(1, 4.0);
  flags.addStageNorm2(1, 5.0);
  flags.markLossNonFinite();
  flags.addGlobalNorm2(9.0);
  flags.markInterrupted(SIGTERM);
  flags.markUpdateNonFinite(1);
  EXPECT_EQ(flags.values(), (std::vector<double>{0.0, 9.0, 1.0, 9.0, 0.0, 1.0, 0.0, 1.0}));
}

TEST(GradientCheckFlags, TheFirstStageThePreviousUpdateLeftNonFinite) {
  GradientCheckFlags a(3), b(3), c(3);
  EXPECT_EQ(sumAndDecode({a, b}).updated_nonfinite_stage, -1);
  a.markUpdateNonFinite(2);
  b.markUpdateNonFinite(1);
  const GradientCheck check = sumAndDecode({a, b, c});
  EXPECT_EQ(check.updated_nonfinite_stage, 1);
  // Parameters are not gradients: the step's own verdict is unaffected.
  EXPECT_FALSE(check.bad.found());
}

TEST(GradientCheckFlags, FiniteStepGivesTheGlobalNormOfAllRanks) {
  GradientCheckFlags a(2), b(2);
  a.addStageNorm2(0, 9.0);
  a.addGlobalNorm2(9.0);
  b.addStageNorm2(1, 16.0);
  b.addGlobalNorm2(16.0);
  const GradientCheck check = sumAndDecode({a, b});
  EXPECT_FALSE(check.bad.found());
  EXPECT_EQ(check.bad.first_stage, -1);
  EXPECT_EQ(check.norm, 5.0);
  EXPECT_EQ(check.interrupted_by, 0);
}

TEST(GradientCheckFlags, FirstNonFiniteStageInPipelineOrder) {
  GradientCheckFlags a(3), b(3);
  a.addStageNorm2(2, std::numeric_limits<double>::infinity());
  b.addStageNorm2(1, std::nan(""));
  b.addStageNorm2(0, 1.0);
  const GradientCheck check = sumAndDecode({a, b});
  EXPECT_EQ(check.bad.first_stage, 1);
  EXPECT_FALSE(check.bad.loss);
  EXPECT_TRUE(check.bad.found());
}

TEST(GradientCheckFlags, NonFiniteLossAloneIsFound) {
  GradientCheckFlags a(1), b(1);
  b.markLossNonFinite();
  const GradientCheck check = sumAndDecode({a, b});
  EXPECT_TRUE(check.bad.loss);
  EXPECT_EQ(check.bad.first_stage, -1);
  EXPECT_TRUE(check.bad.found());
}

TEST(GradientCheckFlags, SigtermOutranksSigint) {
  GradientCheckFlags a(1), b(1), c(1);
  a.markInterrupted(SIGINT);
  EXPECT_EQ(sumAndDecode({a, c}).interrupted_by, SIGINT);
  b.markInterrupted(SIGTERM);
  EXPECT_EQ(sumAndDecode({a, b, c}).interrupted_by, SIGTERM);
  c.markInterrupted(0);
  EXPECT_EQ(sumAndDecode({c}).interrupted_by, 0);
}

stage::PipeManifest tiedManifest() {
  stage::PipeManifest manifest;
  manifest.num_stages = 3;
  manifest.tied = {{"wte.weight", "lm_head.weight"}};
  manifest.stages.resize(3);
  for (int s = 0; s < 3; ++s) manifest.stages[s].index = s;
  manifest.stages[0].parameters = {"wte.weight", "wpe.weight"};
  manifest.stages[1].parameters = {"h.0.w"};
  manifest.stages[2].parameters = {"h.1.w", "lm_head.weight"};
  return manifest;
}

TEST(TiedNames, TiedNamesReadAsTheirGroupsFirstName) {
  const TiedNames names(tiedManifest());
  EXPECT_EQ(names.canonical("lm_head.weight"), "wte.weight");
  EXPECT_EQ(names.canonical("wte.weight"), "wte.weight");
  EXPECT_EQ(names.canonical("h.1.w"), "h.1.w");
}

TEST(TiedNames, FirstHolderIsTheEarliestStageOfTheGroup) {
  const TiedNames names(tiedManifest());
  EXPECT_EQ(names.firstHolder("lm_head.weight"), 0);
  EXPECT_EQ(names.firstHolder("wte.weight"), 0);
  EXPECT_EQ(names.firstHolder("h.0.w"), 1);
  EXPECT_EQ(names.firstHolder("h.1.w"), 2);
  EXPECT_THROW(names.firstHolder("nowhere"), std::out_of_range);
}

}  // namespace
}  // namespace pipeforge::train
