#include "train/progress_bar.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

namespace pipeforge::train {
namespace {

TEST(ProgressBar, FormatsStepLossRateAndEta) {
  StepReport r{40, 2.41071, 9.5e-4, 5120.0, 12.4};
  EXPECT_EQ(formatProgress(r, 100, 20), "[########............]   40/100  loss 2.4107  lr 9.50e-04  5.1k tok/s  ETA 0:12");
  EXPECT_EQ(formatDuration(3723), "1:02:03");
}

TEST(ProgressBar, SaysRowsForTensorDataAndShowsTheGradNorm) {
  StepReport r{3, 0.5, 1e-3, 250.0, 61.0, "rows/s", 0.8251};
  EXPECT_EQ(formatProgress(r, 10, 0), " 3/10  loss 0.5000  lr 1.00e-03  gnorm 0.825  250 rows/s  ETA 1:01");
}

TEST(ProgressBar, PlainLinesWhenNotATerminal) {
  std::ostringstream out;
  {
    ProgressBar bar(out, 10, /*tty=*/false);
    bar.update(StepReport{1, 3.0, 1e-3, 100.0, 9.0});
    bar.note("step 1: checkpoint x");
  }
  EXPECT_EQ(out.str(), "step  1/10  loss 3.0000  lr 1.00e-03  100 tok/s  ETA 0:09\nstep 1: checkpoint x\n");
}

TEST(ProgressBar, RedrawsInPlaceOnATerminal) {
  std::ostringstream out;
  {
    ProgressBar bar(out, 10, /*tty=*/true);
    bar.update(StepReport{1, 3.0, 1e-3, 100.0, 9.0});
    bar.update(StepReport{2, 2.0, 1e-3, 100.0, 8.0});
  }
  const std::string text = out.str();
  EXPECT_EQ(text.front(), '\r');
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1);  // only finish() ends the line
  EXPECT_NE(text.find("2/10"), std::string::npos);
}

}  // namespace
}  // namespace pipeforge::train
