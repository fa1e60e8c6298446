// SVG text and numbers, shared by the schedule timeline and the training curves.
#include "common/svg_text.h"

#include <gtest/gtest.h>

namespace pipeforge {
namespace {

TEST(SvgTextTest, EscapesMarkupAndQuotes) {
  EXPECT_EQ(svgEscape("a<b & \"c\" > d"), "a&lt;b &amp; &quot;c&quot; &gt; d");
  EXPECT_EQ(svgEscape("plain 'single' text"), "plain 'single' text");
  EXPECT_EQ(svgEscape(""), "");
}

TEST(SvgTextTest, NumbersHaveTwoDecimalsAndNoNegativeZero) {
  EXPECT_EQ(svgNumber(1.0), "1.00");
  EXPECT_EQ(svgNumber(12.345), "12.35");  // 12.345 is 12.3450000000000006 in binary
  EXPECT_EQ(svgNumber(-3.5), "-3.50");
  EXPECT_EQ(svgNumber(-0.001), "0.00");
  EXPECT_EQ(svgNumber(-0.0), "0.00");
}

}  // namespace
}  // namespace pipeforge
