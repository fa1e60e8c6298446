#include "runtime/wire_protocol.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "runtime/errors.h"

namespace pipeforge::runtime {
namespace {

using Words = std::vector<std::int64_t>;

TEST(WireProtocolTest, TagsFollowTheirLayout) {
  // (edge * num_microbatches + microbatch) * 3 + kind (Note [Message tags]).
  EXPECT_EQ(messageTag(0, 0, 4, MessageKind::kValue), 0u);
  EXPECT_EQ(messageTag(0, 0, 4, MessageKind::kGrad), 1u);
  EXPECT_EQ(messageTag(0, 0, 4, MessageKind::kMeta), 2u);
  EXPECT_EQ(messageTag(0, 1, 4, MessageKind::kValue), 3u);
  EXPECT_EQ(messageTag(2, 3, 4, MessageKind::kGrad), 34u);
  EXPECT_EQ(messageTag(5, 7, 8, MessageKind::kMeta), 143u);
}

TEST(WireProtocolTest, EveryMessageOfAStepHasItsOwnTag) {
  const int edges = 7, microbatches = 5;
  std::set<std::uint32_t> seen;
  for (int e = 0; e < edges; ++e) {
    for (int mb = 0; mb < microbatches; ++mb) {
      for (MessageKind kind : {MessageKind::kValue, MessageKind::kGrad, MessageKind::kMeta}) {
        EXPECT_TRUE(seen.insert(messageTag(e, mb, microbatches, kind)).second) << e << " " << mb;
      }
    }
  }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(edges * microbatches * 3));
}

TEST(WireProtocolTest, ShapeMessagesHaveAFixedLayout) {
  EXPECT_EQ(encodeShapeMessage(ShapeMessage{{8, 16}, 6}), (Words{6, 2, 8, 16, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(encodeShapeMessage(ShapeMessage{{}, 4}), (Words{4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(encodeShapeMessage(ShapeMessage{{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 15}),
            (Words{15, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
}

TEST(WireProtocolTest, ShapeMessagesRoundTrip) {
  for (const ShapeMessage& shape : {ShapeMessage{{}, 6}, ShapeMessage{{0}, 4}, ShapeMessage{{8, 16, 1024}, 15},
                                    ShapeMessage{{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 11}}) {
    EXPECT_EQ(decodeShapeMessage(encodeShapeMessage(shape)), shape) << shape.sizes.size();
  }
}

TEST(WireProtocolTest, MoreThanTenDimensionsAreRefusedWithTheLimit) {
  try {
    encodeShapeMessage(ShapeMessage{std::vector<std::int64_t>(11, 1), 6});
    FAIL() << "expected RuntimeError";
  } catch (const RuntimeError& e) {
    EXPECT_STREQ(e.what(), "a 11-dimensional tensor crosses stages; at most 10 dimensions are supported");
    EXPECT_EQ(e.code(), ErrorCode::kUserInput);
  }
}

TEST(WireProtocolTest, MalformedShapeMessagesAreRefused) {
  struct Case {
    const char* name;
    Words words;
    std::string error;
  };
  const std::vector<Case> cases = {
      {"short", {6, 1, 8}, "a shape message has 3 words; it should have 12"},
      {"long", Words(13, 0), "a shape message has 13 words; it should have 12"},
      {"negative dtype", {-1, 1, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0}, "a shape message names dtype -1"},
      {"negative ndim", {6, -1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, "a shape message has -1 dimensions; it should have 0 to 10"},
      {"ndim over 10", {6, 11, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, "a shape message has 11 dimensions; it should have 0 to 10"},
      {"negative size", {6, 2, 8, -3, 0, 0, 0, 0, 0, 0, 0, 0}, "a shape message gives dimension 1 size -3"},
      {"words after the sizes", {6, 1, 8, 0, 5, 0, 0, 0, 0, 0, 0, 0},
       "a shape message of 1 dimensions has 5 in word 4, after its sizes"},
  };
  for (const Case& c : cases) {
    try {
      decodeShapeMessage(c.words);
      ADD_FAILURE() << c.name << ": expected an error";
    } catch (const pipeforge::Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInternal) << c.name;
      EXPECT_NE(std::string(e.what()).find(c.error), std::string::npos) << c.name << ": " << e.what();
    }
  }
}

TEST(WireProtocolTest, TransfersAreNamedAsTheTraceShowsThem) {
  EXPECT_EQ((Transfer{true, 1, 'F', 3, 0}.name()), "recv 1F3 from rank 0");
  EXPECT_EQ((Transfer{false, 0, 'B', 2, 5}.name()), "send 0B2 to rank 5");
  EXPECT_EQ((Transfer{true, 1, 'F', 3, 0, /*shape=*/true}.name()), "recv 1F3 shape from rank 0");
  EXPECT_EQ((Transfer{false, 0, 'F', 3, 1, /*shape=*/true}.name()), "send 0F3 shape to rank 1");
}

}  // namespace
}  // namespace pipeforge::runtime
