#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "schedules/csv.h"
#include "schedules/generate.h"

namespace pipeforge::schedules {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> actionsOf(const Program& p, int rank) {
  std::vector<std::string> out;
  for (const auto& cell : p.actions[rank]) {
    if (cell) out.push_back(formatAction(*cell));
  }
  return out;
}

// Rank 0 of PP2 N3M5 VP2 follows Megatron's docstring order
// 1 1 1 2 2 2 -2 1 -2 1 -2 2 -1 2 -1 -1 -2 -2 -1 -1, chunk c being stage (c-1)*2.
TEST(MegatronInterleaved, FollowsMegatronsOrder) {
  ScheduleConfig config{2, 2, 5};
  config.microbatch_group_size_per_vp_stage = 3;
  Program p = generateSchedule("MegatronInterleaved", config);
  EXPECT_EQ(p.stage_to_rank, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(actionsOf(p, 0),
            (std::vector<std::string>{"0F0", "0F1", "0F2", "2F0", "2F1", "2F2", "2B0", "0F3",
                                      "2B1", "0F4", "2B2", "2F3", "0B0", "2F4", "0B1", "0B2",
                                      "2B3", "2B4", "0B3", "0B4"}));
}

// Default group size = p. Laid out on unit steps: rank 0 idles at steps 12
// and 14 waiting for 3B2 and 3B3.
TEST(MegatronInterleaved, TwoRanksTwoChunksFourMicrobatchesOnUnitSteps) {
  EXPECT_EQ(programToCsv(generateSchedule("MegatronInterleaved", {2, 2, 4})),
            "0F0,0F1,2F0,2F1,0F2,2B0,0F3,2B1,2F2,0B0,2F3,0B1,,2B2,,2B3,0B2,0B3\n"
            ",1F0,1F1,3F0,3B0,3F1,3B1,1F2,1B0,1F3,1B1,3F2,3B2,3F3,3B3,1B2,1B3\n");
}

TEST(MegatronInterleaved, RejectsWhatMegatronRejects) {
  try {
    generateSchedule("MegatronInterleaved", {4, 2, 6});  // group 4, 6 % 4 = 2 < 4
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("the last microbatch group would hold 2 = 6 % 4"));
  }
  try {
    generateSchedule("MegatronInterleaved", {4, 2, 3});  // group 4 > m
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("must range in [PP=4, M=3]"));
    EXPECT_THAT(e.what(), HasSubstr("use at least 4 microbatches"));
  }
  ScheduleConfig small_group{4, 2, 8};
  small_group.microbatch_group_size_per_vp_stage = 2;
  EXPECT_THROW(generateSchedule("MegatronInterleaved", small_group), ScheduleError);
  ScheduleConfig ok{4, 2, 6};
  ok.microbatch_group_size_per_vp_stage = 6;
  EXPECT_NO_THROW(generateSchedule("MegatronInterleaved", ok));
}

}  // namespace
}  // namespace pipeforge::schedules
