// The mesh's rank arithmetic against golden tables (Note [Mesh order]), and
// its refusals, with no communicator.
#include "mesh/mesh_layout.h"

#include <gtest/gtest.h>

#include <set>

namespace pipeforge::mesh {
namespace {

using Groups = std::vector<std::vector<int>>;

TEST(MeshLayout, TheNotesTableOnEightRanks) {
  const MeshLayout m = MeshLayout::create({/*pp=*/2, /*tp=*/2, /*dp=*/2}, 8);
  const int tp[] = {0, 1, 0, 1, 0, 1, 0, 1};
  const int pp[] = {0, 0, 1, 1, 0, 0, 1, 1};
  const int dp[] = {0, 0, 0, 0, 1, 1, 1, 1};
  for (int r = 0; r < 8; ++r) {
    const MeshCoords c = m.coordsOf(r);
    EXPECT_EQ(c.tp, tp[r]) << r;
    EXPECT_EQ(c.pp, pp[r]) << r;
    EXPECT_EQ(c.dp, dp[r]) << r;
    EXPECT_EQ(m.rankOf(c), r);
  }
  EXPECT_EQ(m.group(Axis::kTp, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(m.group(Axis::kPp, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(m.group(Axis::kDp, 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(m.groups(Axis::kTp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(m.groups(Axis::kPp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(m.groups(Axis::kDp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

// With tp 1 the mesh is the layout Pipeforge always had: replica r / PP,
// pipeline rank r % PP, which checkpoints and host placement rely on.
TEST(MeshLayout, WithoutTensorParallelItIsTheReplicaMajorLayout) {
  for (int world : {1, 2, 4, 6, 8, 12}) {
    for (int dp = 1; dp <= world; ++dp) {
      if (world % dp != 0) continue;
      const MeshLayout m = MeshLayout::fromWorld(world, /*tp=*/1, dp);
      const int pp = world / dp;
      EXPECT_EQ(m.size(Axis::kPp), pp);
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(m.coordsOf(r).pp, r % pp);
        EXPECT_EQ(m.coordsOf(r).dp, r / pp);
        std::vector<int> replicas;
        for (int d = 0; d < dp; ++d) replicas.push_back(d * pp + r % pp);
        EXPECT_EQ(m.group(Axis::kDp, r), replicas);
      }
    }
  }
}

TEST(MeshLayout, EveryAxisPartitionsTheWorld) {
  const MeshLayout m = MeshLayout::create({3, 2, 4}, 24);
  for (Axis axis : kAxes) {
    std::multiset<int> seen;
    for (const auto& g : m.groups(axis)) {
      EXPECT_EQ(static_cast<int>(g.size()), m.size(axis)) << axisName(axis);
      seen.insert(g.begin(), g.end());
      for (int r : g) EXPECT_EQ(m.group(axis, r), g);
    }
    EXPECT_EQ(seen.size(), 24u);
    EXPECT_EQ(std::set<int>(seen.begin(), seen.end()).size(), 24u);
  }
  EXPECT_EQ(m.describe(), "pp 3 × tp 2 × dp 4 on 24 ranks");
}

TEST(MeshLayout, SizesThatDoNotFitTheWorldAreRefusedWithTheNumbers) {
  try {
    MeshLayout::create({2, 4, 3}, 16);
    FAIL();
  } catch (const MeshError& e) {
    EXPECT_STREQ(e.what(), "pp 2 × tp 4 × dp 3 = 24 ≠ world size 16; the sizes must multiply to the number of ranks");
  }
  try {
    MeshLayout::fromWorld(6, 1, 4);
    FAIL();
  } catch (const MeshError& e) {
    EXPECT_STREQ(e.what(), "world size 6 is not a multiple of tp 1 × dp 4 = 4; change pipeline.data_parallel or the "
                           "number of ranks so that it divides them");
  }
  EXPECT_THROW(MeshLayout::create({0, 1, 1}, 0), MeshError);
  const MeshLayout m = MeshLayout::create({2, 1, 2}, 4);
  EXPECT_THROW(m.coordsOf(4), MeshError);
  EXPECT_THROW(m.rankOf(MeshCoords{2, 0, 0}), MeshError);
}

}  // namespace
}  // namespace pipeforge::mesh
