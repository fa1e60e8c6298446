#include "schedules/megatron_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "schedules/program.h"

namespace pipeforge::schedules {
namespace {

using ::testing::HasSubstr;

// Megatron's docstring example: PP2 N3M5 VP2 (group size 3, 5 microbatches,
// 2 model chunks).
TEST(MegatronTable, ScheduleTableOfTheDocstringExample) {
  MegatronScheduleTable table = getScheduleTable(5, 2, 3);
  EXPECT_EQ(table, (MegatronScheduleTable{{0, 0}, {1, 0}, {2, 0}, {0, 1}, {1, 1}, {2, 1},
                                          {3, 0}, {4, 0}, {3, 1}, {4, 1}}));
}

TEST(MegatronTable, OrderOfTheDocstringExampleWithFiveWarmupMicrobatches) {
  EXPECT_EQ(convertScheduleTableToOrder(5, 2, getScheduleTable(5, 2, 3)),
            (std::vector<int>{1, 1, 1, 2, 2, 2, -2, 1, -2, 1, -2, 2, -1, 2, -1, -1, -2, -2, -1,
                              -1}));
}

TEST(MegatronTable, WarmupExtremes) {
  auto table = getScheduleTable(2, 2, 2);  // (0,0) (1,0) (0,1) (1,1)
  // No warm-up: strictly alternating forward/backward.
  EXPECT_EQ(convertScheduleTableToOrder(0, 2, table),
            (std::vector<int>{1, -2, 1, -2, 2, -1, 2, -1}));
  // Warm-up covering everything (or more): all forwards, then all backwards.
  EXPECT_EQ(convertScheduleTableToOrder(4, 2, table),
            (std::vector<int>{1, 1, 2, 2, -2, -2, -1, -1}));
  EXPECT_EQ(convertScheduleTableToOrder(9, 2, table), convertScheduleTableToOrder(4, 2, table));
}

TEST(MegatronTable, ShortLastGroup) {
  EXPECT_EQ(getScheduleTable(3, 2, 2),
            (MegatronScheduleTable{{0, 0}, {1, 0}, {0, 1}, {1, 1}, {2, 0}, {2, 1}}));
  EXPECT_EQ(getScheduleTable(2, 1, 4), (MegatronScheduleTable{{0, 0}, {1, 0}}));
}

TEST(MegatronTable, WarmupCountPerRank) {
  // (p - r - 1) * 2 + (chunks - 1) * group, capped at m * chunks.
  EXPECT_EQ(megatronNumWarmupMicrobatches(2, 0, 2, 3, 5), 5);
  EXPECT_EQ(megatronNumWarmupMicrobatches(2, 1, 2, 3, 5), 3);
  EXPECT_EQ(megatronNumWarmupMicrobatches(4, 0, 2, 4, 4), 8);
  EXPECT_EQ(megatronNumWarmupMicrobatches(8, 0, 2, 8, 8), 16);  // 14 + 8 capped at 16
}

TEST(MegatronTable, RejectsNonsense) {
  EXPECT_THROW(getScheduleTable(0, 2, 2), ScheduleError);
  EXPECT_THROW(getScheduleTable(4, 0, 2), ScheduleError);
  EXPECT_THROW(getScheduleTable(4, 2, 0), ScheduleError);
  EXPECT_THROW(convertScheduleTableToOrder(-1, 2, getScheduleTable(2, 2, 2)), ScheduleError);
  EXPECT_THROW(convertScheduleTableToOrder(1, 2, {}), ScheduleError);
  try {
    convertScheduleTableToOrder(1, 2, {{0, 0}, {0, 2}});
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("model chunk id 2"));
  }
}

}  // namespace
}  // namespace pipeforge::schedules
