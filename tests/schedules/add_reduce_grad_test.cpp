#include <gtest/gtest.h>

#include "schedules/csv.h"
#include "schedules/lower.h"

namespace pipeforge::schedules {
namespace {

// PyTorch's test_reduce_grad cases (n_microbatches = 2).
TEST(AddReduceGrad, PyTorchExamples) {
  EXPECT_EQ(programToCsv(addReduceGrad(programFromCsv("0F0,0F1,   ,0B0,0B1\n"))),
            "0F0,0F1,0B0,0B1,0REDUCE_GRAD\n");
  EXPECT_EQ(programToCsv(addReduceGrad(programFromCsv("0F0,0F1,1F0,1F1,1B0,1B1,0B0,0B1\n"))),
            "0F0,0F1,1F0,1F1,1B0,1B1,1REDUCE_GRAD,0B0,0B1,0REDUCE_GRAD\n");
}

// W (not I) completes a split backward; OVERLAP_F_B counts its B.
TEST(AddReduceGrad, CountsWeightGradientsAndOverlapSubActions) {
  Program p = programFromCsv("0F0,0F1,1F0,0I0,0W0,(1F1;0B1)OVERLAP_F_B,1B0,1I1,1W1\n");
  EXPECT_EQ(programToCsv(addReduceGrad(p)),
            "0F0,0F1,1F0,0I0,0W0,(1F1;0B1)OVERLAP_F_B,0REDUCE_GRAD,1B0,1I1,1W1,1REDUCE_GRAD\n");
}

TEST(AddReduceGrad, EveryStageOfEveryRank) {
  Program p = programFromCsv("0F0,,,0B0\n,1F0,1B0\n");
  EXPECT_EQ(programToCsv(addReduceGrad(p)), "0F0,0B0,0REDUCE_GRAD\n1F0,1B0,1REDUCE_GRAD\n");
}

}  // namespace
}  // namespace pipeforge::schedules
