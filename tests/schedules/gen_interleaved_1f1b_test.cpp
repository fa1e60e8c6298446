#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "schedules/csv.h"
#include "schedules/generate.h"

namespace pipeforge::schedules {
namespace {

using ::testing::HasSubstr;

// p=2, 2 stages per rank, m=4: rounds = 2, 2 microbatches per round.
// Rank 0: warm-up (2-1)*2 + 2*(2-1-0) = 4 forwards, then
// (2*2 + 2*1) - 4 = 2 idle steps, 4 F/B pairs, 4 cool-down backwards each
// after an idle step. Rank 1: 1 idle step, warm-up 2, 1 idle, 6 pairs, 2
// cool-down backwards.
TEST(Interleaved1F1B, TwoRanksTwoStagesFourMicrobatches) {
  Program p = generateSchedule("Interleaved1F1B", {2, 2, 4});
  EXPECT_EQ(p.stage_to_rank, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(programToCsv(p),
            "0F0,0F1,2F0,2F1,,,0F2,2B0,0F3,2B1,2F2,0B0,2F3,0B1,,2B2,,2B3,,0B2,,0B3\n"
            ",1F0,1F1,,3F0,3B0,3F1,3B1,1F2,1B0,1F3,1B1,3F2,3B2,3F3,3B3,,1B2,,1B3\n");
}

// Fewer microbatches than ranks: one round of m microbatches (PyTorch's
// flexible rounds), the warm-up capped at m * stages_per_rank.
TEST(Interleaved1F1B, OneRoundWhenMicrobatchesBelowRanks) {
  Program p = generateSchedule("Interleaved1F1B", {4, 2, 3});
  ASSERT_EQ(p.actions.size(), 4u);
  // Rank 0 warms up min(1*3 + 2*3, 6) = 6 forwards: all its forwards.
  std::vector<std::string> rank0;
  for (const auto& cell : p.actions[0]) {
    if (cell) rank0.push_back(formatAction(*cell));
  }
  EXPECT_EQ(rank0, (std::vector<std::string>{"0F0", "0F1", "0F2", "4F0", "4F1", "4F2", "4B0",
                                             "4B1", "4B2", "0B0", "0B1", "0B2"}));
}

TEST(Interleaved1F1B, RejectsMicrobatchesThatAreNotAMultipleOfTheRounds) {
  try {
    generateSchedule("Interleaved1F1B", {4, 2, 9});
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("max(1, 9 / 4) = 2"));
    EXPECT_THAT(e.what(), HasSubstr("9 % 2 = 1"));
    EXPECT_THAT(e.what(), HasSubstr("use 8 or 10 microbatches"));
  }
  // Both suggestions really are accepted.
  EXPECT_NO_THROW(generateSchedule("Interleaved1F1B", {4, 2, 8}));
  EXPECT_NO_THROW(generateSchedule("Interleaved1F1B", {4, 2, 10}));
  // p=2, m=7: rounds 3, and 9 (rounds 4) would not do; the next valid is 8.
  try {
    generateSchedule("Interleaved1F1B", {2, 2, 7});
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("use 6 or 8 microbatches"));
  }
}

}  // namespace
}  // namespace pipeforge::schedules
