#include "sharding/shard_layout.h"

#include <stdexcept>

#include <gtest/gtest.h>

namespace pipeforge::sharding {
namespace {

TEST(ShardLayout, PiecesCoverEveryElementOnceInRankOrder) {
  // 10 elements over 4 ranks: chunks of 3, pieces 3, 3, 3, 1 (torch.chunk's
  // rows for dim 10 over 4); 5 over 4: 2, 2, 1, 0; 3 over 4: 1, 1, 1, 0.
  const std::vector<std::int64_t> numels{10, 5, 3, 0, 8};
  const std::vector<std::vector<std::int64_t>> sizes{{3, 3, 3, 1}, {2, 2, 1, 0}, {1, 1, 1, 0}, {0, 0, 0, 0}, {2, 2, 2, 2}};
  for (std::size_t i = 0; i < numels.size(); ++i) {
    std::int64_t next = 0;
    for (int k = 0; k < 4; ++k) {
      const ElementRange p = pieceOf(numels[i], 4, k);
      EXPECT_EQ(p.size(), sizes[i][k]) << "tensor " << i << " rank " << k;
      EXPECT_EQ(p.begin, std::min(next, numels[i]));
      next = p.end > next ? p.end : next;
    }
    EXPECT_EQ(next, numels[i]);
  }
}

TEST(ShardLayout, BuffersPadEveryPieceToItsChunk) {
  const ShardLayout layout({10, 5, 3}, 4, 3);
  EXPECT_EQ(layout.chunk(0), 3);
  EXPECT_EQ(layout.chunk(1), 2);
  EXPECT_EQ(layout.chunk(2), 1);
  EXPECT_EQ(layout.offset(0), 0);
  EXPECT_EQ(layout.offset(1), 3);
  EXPECT_EQ(layout.offset(2), 5);
  EXPECT_EQ(layout.bufferSize(), 6);
  EXPECT_EQ(layout.own(0), (ElementRange{9, 10}));
  EXPECT_TRUE(layout.own(1).empty());
  EXPECT_EQ(layout.own(1).begin, 5);
  EXPECT_EQ(layout.ownedElements(), 1);
  EXPECT_EQ(ShardLayout({10, 5, 3}, 4, 0).ownedElements(), 6);
  // One rank owns everything, with no padding.
  const ShardLayout whole({10, 5}, 1, 0);
  EXPECT_EQ(whole.bufferSize(), 15);
  EXPECT_EQ(whole.own(1), (ElementRange{0, 5}));
}

TEST(ShardLayout, IntersectFindsWhatTwoGroupSizesShare) {
  // Rank 1 of 3 holds [4, 8) of 10; rank 0 of 2 holds [0, 5): they share [4, 5).
  EXPECT_EQ(intersect(pieceOf(10, 3, 1), pieceOf(10, 2, 0)), (ElementRange{4, 5}));
  EXPECT_TRUE(intersect(pieceOf(10, 3, 0), pieceOf(10, 2, 1)).empty());
}

TEST(ShardLayout, RejectsBadGroups) {
  EXPECT_THROW(ShardLayout({4}, 0, 0), std::invalid_argument);
  EXPECT_THROW(ShardLayout({4}, 2, 2), std::invalid_argument);
  EXPECT_THROW(ShardLayout({-1}, 2, 0), std::invalid_argument);
}

}  // namespace
}  // namespace pipeforge::sharding
