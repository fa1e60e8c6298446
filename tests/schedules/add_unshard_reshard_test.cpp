#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "schedules/csv.h"
#include "schedules/lower.h"

namespace pipeforge::schedules {
namespace {

using ::testing::HasSubstr;

// PyTorch's test_unshard_reshard cases (max_active_stages = 3).
TEST(AddUnshardReshard, PyTorchExamples) {
  EXPECT_EQ(programToCsv(addUnshardReshard(programFromCsv("0F0,0F1,   ,0B0,0B1\n"), 3)),
            "0UNSHARD,0F0,0F1,0B0,0B1,0RESHARD\n");
  EXPECT_EQ(
      programToCsv(addUnshardReshard(programFromCsv("0F0,0F1,1F0,1F1,1B0,1B1,0B0,0B1\n"), 3)),
      "0UNSHARD,1UNSHARD,0F0,0F1,1F0,1F1,1B0,1B1,1RESHARD,0B0,0B1,0RESHARD\n");
}

// One active stage: every switch reshards the old stage and unshards the new.
TEST(AddUnshardReshard, OneActiveStageSwapsOnEveryChange) {
  EXPECT_EQ(programToCsv(addUnshardReshard(programFromCsv("0F0,1F0,1B0,0B0\n"), 1)),
            "0UNSHARD,0F0,0RESHARD,1UNSHARD,1F0,1B0,1RESHARD,0UNSHARD,0B0,0RESHARD\n");
}

// Prefetch order is order of first use; eviction drops what is not among
// the next max_active_stages stages.
TEST(AddUnshardReshard, PrefetchesInOrderOfUseAndEvictsUnneeded) {
  EXPECT_EQ(programToCsv(addUnshardReshard(programFromCsv("1F0,0F0,2F0,1B0,0B0,2B0\n"), 2)),
            "1UNSHARD,0UNSHARD,1F0,1RESHARD,2UNSHARD,0F0,0RESHARD,1UNSHARD,2F0,2RESHARD,"
            "0UNSHARD,1B0,1RESHARD,2UNSHARD,0B0,0RESHARD,2B0,2RESHARD\n");
}

// Like PyTorch, an OVERLAP_F_B brings in all of its stages even past the limit.
TEST(AddUnshardReshard, OverlapBringsAllItsStages) {
  EXPECT_EQ(programToCsv(addUnshardReshard(
                programFromCsv("(0F0;1B0)OVERLAP_F_B,2F0,0B0,1F0,2B0\n"), 1)),
            "0UNSHARD,1UNSHARD,(0F0;1B0)OVERLAP_F_B,0RESHARD,1RESHARD,2UNSHARD,2F0,2RESHARD,"
            "0UNSHARD,0B0,0RESHARD,1UNSHARD,1F0,1RESHARD,2UNSHARD,2B0,2RESHARD\n");
}

TEST(AddUnshardReshard, RejectsNonPositiveLimit) {
  try {
    addUnshardReshard(programFromCsv("0F0,0B0\n"), 0);
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("max_active_stages must be at least 1"));
  }
}

}  // namespace
}  // namespace pipeforge::schedules
