#include <gtest/gtest.h>

#include "schedules/csv.h"
#include "schedules/lower.h"

namespace pipeforge::schedules {
namespace {

// PyTorch's test_merge_bw: only an I immediately followed by the W of the
// same stage and microbatch merges (0I2,0W2 -> 0B2; 0I0/0W0 are not adjacent).
TEST(MergeBackward, PyTorchExample) {
  Program p = programFromCsv("0F0,0F1,0F2,0I0,0I1,0W0,0I2,0W2,0W1\n");
  EXPECT_EQ(programToCsv(mergeBackward(p)), "0F0,0F1,0F2,0I0,0I1,0W0,0B2,0W1\n");
}

TEST(MergeBackward, SkipsIdleStepsBetweenIAndWAndDropsThem) {
  Program p = programFromCsv("0F0,,0I0,,   ,0W0,\n,1F0,1I0,1W0\n");
  Program merged = mergeBackward(p);
  EXPECT_EQ(programToCsv(merged), "0F0,0B0\n1F0,1B0\n");
  EXPECT_EQ(merged.stage_to_rank, p.stage_to_rank);
  EXPECT_EQ(merged.num_microbatches, p.num_microbatches);
}

TEST(MergeBackward, DifferentStageOrMicrobatchDoesNotMerge) {
  Program p = programFromCsv("0F0,0F1,1F0,1F1,1I0,0W0,0I1,0W0,1I1,1W0,1W1,0I0,0W1\n");
  EXPECT_EQ(programToCsv(mergeBackward(p)),
            "0F0,0F1,1F0,1F1,1I0,0W0,0I1,0W0,1I1,1W0,1W1,0I0,0W1\n");
}

}  // namespace
}  // namespace pipeforge::schedules
