// Value meta: pipe.json's "float32[6, 8]", older files' "Float[6, 8]", and sizes in bytes.
#include "stage/value_meta.h"

#include <gtest/gtest.h>

namespace pipeforge::stage {
namespace {

TEST(ValueMeta, ParsesOursAndC10sSpelling) {
  struct Case {
    const char* text;
    ValueMeta meta;
  };
  const Case cases[] = {
      {"float32[6, 8]", {"float32", {6, 8}}},
      {"Float[6, 8]", {"float32", {6, 8}}},
      {"Long[2, 16]", {"int64", {2, 16}}},
      {"BFloat16[4]", {"bfloat16", {4}}},
      {"Bool[]", {"bool", {}}},
      {"Byte[3]", {"byte", {3}}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    auto parsed = parseValueMeta(c.text);
    ASSERT_TRUE(parsed.has_value());
    EXPECT_EQ(*parsed, c.meta);
  }
  for (const char* bad : {"", "Float", "[6, 8]", "float32[6, x]", "float32[6,, 8]", "float32[6, 8"}) {
    SCOPED_TRACE(bad);
    EXPECT_FALSE(parseValueMeta(bad).has_value());
  }
}

TEST(ValueMeta, FormatsAndSizes) {
  EXPECT_EQ(formatValueMeta({"float32", {2, 16, 32}}), "float32[2, 16, 32]");
  EXPECT_EQ(formatValueMeta({"int64", {}}), "int64[]");
  EXPECT_EQ(valueBytes({"float32", {2, 16, 32}}), 2 * 16 * 32 * 4);
  EXPECT_EQ(valueBytes({"bfloat16", {3, 5}}), 30);
  EXPECT_EQ(valueBytes({"int64", {}}), 8);
  EXPECT_FALSE(valueBytes({"byte", {3}}).has_value()) << "an element size we do not know is not guessed";
  EXPECT_EQ(describeValueMeta("Float[6, 8]"), "float32[6, 8] (192 B)");
  EXPECT_EQ(describeValueMeta("Byte[3]"), "byte[3]");
  EXPECT_EQ(describeValueMeta("not meta"), "not meta");
}

}  // namespace
}  // namespace pipeforge::stage
