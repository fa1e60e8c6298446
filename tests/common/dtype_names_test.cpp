// Dtype names: ours and PyTorch's spellings map to one Dtype; others are refused.
#include "common/dtype_names.h"

#include <gtest/gtest.h>

namespace pipeforge {
namespace {

TEST(DtypeNamesTest, CanonicalNamesRoundTrip) {
  for (Dtype d : {Dtype::kFloat32, Dtype::kFloat64, Dtype::kFloat16, Dtype::kBFloat16, Dtype::kInt64, Dtype::kInt32,
                  Dtype::kBool}) {
    auto parsed = parseDtype(dtypeName(d));
    ASSERT_TRUE(parsed.has_value()) << dtypeName(d);
    EXPECT_EQ(*parsed, d);
    EXPECT_EQ(parseDtype(std::string("torch.") + dtypeName(d)), d);
  }
}

TEST(DtypeNamesTest, PyTorchAliases) {
  EXPECT_EQ(parseDtype("float"), Dtype::kFloat32);
  EXPECT_EQ(parseDtype("torch.float"), Dtype::kFloat32);
  EXPECT_EQ(parseDtype("double"), Dtype::kFloat64);
  EXPECT_EQ(parseDtype("half"), Dtype::kFloat16);
  EXPECT_EQ(parseDtype("long"), Dtype::kInt64);
  EXPECT_EQ(parseDtype("torch.long"), Dtype::kInt64);
  EXPECT_EQ(parseDtype("int"), Dtype::kInt32);
}

TEST(DtypeNamesTest, ElementSizes) {
  EXPECT_EQ(dtypeSize(Dtype::kFloat64), 8);
  EXPECT_EQ(dtypeSize(Dtype::kInt64), 8);
  EXPECT_EQ(dtypeSize(Dtype::kFloat32), 4);
  EXPECT_EQ(dtypeSize(Dtype::kInt32), 4);
  EXPECT_EQ(dtypeSize(Dtype::kFloat16), 2);
  EXPECT_EQ(dtypeSize(Dtype::kBFloat16), 2);
  EXPECT_EQ(dtypeSize(Dtype::kBool), 1);
}

TEST(DtypeNamesTest, UnknownNamesAreRefused) {
  EXPECT_FALSE(parseDtype("complex"));
  EXPECT_FALSE(parseDtype("Float32"));
  EXPECT_FALSE(parseDtype("torch."));
  EXPECT_FALSE(parseDtype(""));
  EXPECT_EQ(dtypeChoices(), "float32, float64, float16, bfloat16, int64, int32 or bool");
}

}  // namespace
}  // namespace pipeforge
