#include "common/byte_size.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

namespace pipeforge {
namespace {

TEST(ByteSize, ParsesDecimalAndBinaryUnitsInAnyCase) {
  struct Case {
    std::string text;
    std::optional<double> bytes;
  };
  const std::vector<Case> cases = {
      {"512MiB", 512.0 * 1024 * 1024},
      {"8GiB", 8.0 * 1024 * 1024 * 1024},
      {"1.5 kib", 1536.0},
      {"100B", 100.0},
      {"2KB", 2000.0},
      {"3gb", 3e9},
      {"0.5TB", 0.5e12},
      {"1", std::nullopt},     // a plain number has no unit
      {"MiB", std::nullopt},   // a unit without a number
      {"-1MiB", std::nullopt}, // sizes are not negative
      {"1xMiB", std::nullopt},
      {"1 apple", std::nullopt},
      {"", std::nullopt},
  };
  for (const auto& c : cases) EXPECT_EQ(parseByteSize(c.text), c.bytes) << c.text;
}

TEST(ByteSize, FormatsInTheLargestBinaryUnitReached) {
  EXPECT_EQ(formatByteSize(100), "100 B");
  EXPECT_EQ(formatByteSize(1536), "1.5 KiB");
  EXPECT_EQ(formatByteSize(6.5 * 1024 * 1024 * 1024), "6.5 GiB");
  EXPECT_EQ(formatByteSize(0), "0 B");
}

}  // namespace
}  // namespace pipeforge
