#include <gtest/gtest.h>

#include "schedules/csv.h"
#include "schedules/generate.h"

namespace pipeforge::schedules {
namespace {

// Rank r: r idle steps, every microbatch through each local stage in turn,
// 2 * (p - 1 - r) idle steps, then backwards from the last local stage and the
// newest microbatch down (ScheduleLoopedBFS._calculate_single_rank_operations).
TEST(LoopedBFS, TwoRanksTwoStagesEachTwoMicrobatches) {
  Program p = generateSchedule("LoopedBFS", {2, 2, 2});
  EXPECT_EQ(p.num_stages, 4);
  EXPECT_EQ(p.stage_to_rank, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(programToCsv(p),
            "0F0,0F1,2F0,2F1,,,2B1,2B0,0B1,0B0\n"
            ",1F0,1F1,3F0,3F1,3B1,3B0,1B1,1B0\n");
}

TEST(LoopedBFS, OneStagePerRankAndAnyMicrobatchCount) {
  EXPECT_EQ(programToCsv(generateSchedule("LoopedBFS", {3, 1, 1})),
            "0F0,,,,,0B0\n"
            ",1F0,,,1B0\n"
            ",,2F0,2B0\n");
}

}  // namespace
}  // namespace pipeforge::schedules
