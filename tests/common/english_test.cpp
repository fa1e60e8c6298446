#include "common/english.h"

#include <gtest/gtest.h>

namespace pipeforge {
namespace {

TEST(English, CountedAddsAnSExceptForOne) {
  EXPECT_EQ(counted(0, "stage"), "0 stages");
  EXPECT_EQ(counted(1, "stage"), "1 stage");
  EXPECT_EQ(counted(2, "pipeline rank"), "2 pipeline ranks");
  EXPECT_EQ(counted(-1, "rank"), "-1 ranks");
  EXPECT_EQ(counted(std::int64_t{1} << 40, "byte"), "1099511627776 bytes");
}

TEST(English, JoinChoicesSaysOrBeforeTheLast) {
  EXPECT_EQ(joinChoices({}), "");
  EXPECT_EQ(joinChoices({"a"}), "a");
  EXPECT_EQ(joinChoices({"a", "b"}), "a or b");
  EXPECT_EQ(joinChoices({"a", "b", "c"}), "a, b or c");
  EXPECT_EQ(joinChoices({"a", "b", "c", "d"}), "a, b, c or d");
}

}  // namespace
}  // namespace pipeforge
