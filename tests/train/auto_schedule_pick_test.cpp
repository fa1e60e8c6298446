// Note [Auto schedule]: the ranks' digests of what they chose must agree.
// Profiling and switching on real stages: tests/train/test_schedule_csv_and_auto.py.
#include "train/auto_schedule_pick.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace pipeforge::train {
namespace {

TEST(AutoSchedulePick, EqualDigestsPass) {
  EXPECT_NO_THROW(checkSameProgram({0x1234, 0x1234, 0x1234}));
  EXPECT_NO_THROW(checkSameProgram({0x1234}));
}

TEST(AutoSchedulePick, ADifferentDigestIsABugNamingTheRank) {
  try {
    checkSameProgram({0x1234, 0x1234, 0x99, 0x77});
    ADD_FAILURE() << "checkSameProgram did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
    EXPECT_EQ(std::string(e.what()),
              "pipeline.schedule auto: rank 2 chose another program than rank 0 (digest 00000099 vs 00001234) from "
              "the same costs; this is a bug, please report it; name a schedule in pipeline.schedule meanwhile");
  }
}

}  // namespace
}  // namespace pipeforge::train
