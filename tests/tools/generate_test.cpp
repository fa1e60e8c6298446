// The pure parts of `pipeforge generate`: seeded sampling (Note [Seeded
// sampling]), the block size read from a position embedding, byte escaping.
// The whole command is checked against PyTorch in test_generate_eval_in_python.py.
#include <gtest/gtest.h>

#include <map>

#include "config/train_config.h"
#include "tools/generate.h"

namespace pipeforge::train {
namespace {

TEST(SampleToken, GreedyTakesTheFirstLargestLogit) {
  EXPECT_EQ(sampleToken({0.5, 2.0, -1.0, 2.0}, 0.0, 0, 1, 0), 1);
  EXPECT_EQ(sampleToken({3.0}, 0.0, 0, 1, 0), 0);
}

TEST(SampleToken, TopOneIsGreedyAtAnyTemperatureAndSeed) {
  const std::vector<double> logits{0.1, 0.3, 0.2, -4.0};
  for (std::uint64_t seed = 0; seed < 20; ++seed) EXPECT_EQ(sampleToken(logits, 5.0, 1, seed, 7), 1);
}

TEST(SampleToken, SameKeysSameTokenAndTopKBoundsTheChoice) {
  const std::vector<double> logits{1.0, 0.9, 0.8, 0.7, -2.0, -3.0};
  std::map<std::int64_t, int> seen;
  for (std::int64_t index = 0; index < 400; ++index) {
    const std::int64_t t = sampleToken(logits, 1.0, 3, 42, index);
    EXPECT_EQ(t, sampleToken(logits, 1.0, 3, 42, index));  // stateless
    ++seen[t];
  }
  // Only the 3 largest logits, each drawn (about 1/3 each: 133 of 400).
  ASSERT_EQ(seen.size(), 3u);
  for (std::int64_t t : {0, 1, 2}) EXPECT_GT(seen[t], 90) << t;
  // Another seed draws another sequence.
  int differ = 0;
  for (std::int64_t index = 0; index < 50; ++index) {
    differ += sampleToken(logits, 1.0, 3, 42, index) != sampleToken(logits, 1.0, 3, 43, index);
  }
  EXPECT_GT(differ, 10);
}

TEST(SampleToken, LowTemperatureFollowsTheLargestLogit) {
  for (std::int64_t index = 0; index < 50; ++index) {
    EXPECT_EQ(sampleToken({0.0, 1.0, 0.5}, 1e-3, 0, 9, index), 1);
  }
}

using Shapes = std::vector<std::pair<std::string, std::vector<std::int64_t>>>;

TEST(PositionEmbeddingRows, ReadsTheKnownNames) {
  EXPECT_EQ(positionEmbeddingRows({{"wte.weight", {256, 64}}, {"wpe.weight", {64, 64}}}).value_or(-1), 64);
  EXPECT_EQ(positionEmbeddingRows({{"transformer.pos_emb", {1, 128, 32}}}).value_or(-1), 128);
  EXPECT_EQ(positionEmbeddingRows({{"model.embed_positions.weight", {2048, 8}}}).value_or(-1), 2048);
  // Tied copies with one size agree.
  EXPECT_EQ(positionEmbeddingRows({{"a.wpe.weight", {32, 8}}, {"b.wpe.weight", {32, 8}}}).value_or(-1), 32);
}

TEST(PositionEmbeddingRows, NoneOrDisagreeing) {
  EXPECT_FALSE(positionEmbeddingRows({{"wte.weight", {256, 64}}, {"wpe_scale", {64}}, {"wpe.bias", {64}}}));
  EXPECT_FALSE(positionEmbeddingRows({{"pos_emb", {2, 64, 8}}}));  // not [1, T, C]
  try {
    positionEmbeddingRows({{"enc.wpe.weight", {64, 8}}, {"dec.wpe.weight", {32, 8}}});
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'enc.wpe.weight' (64 positions) and 'dec.wpe.weight' (32) disagree; give "
                                         "the model's maximum sequence length with --block-size N"),
              std::string::npos)
        << e.what();
  }
}

TEST(EscapeBytes, PrintableAsIsTheRestEscaped) {
  EXPECT_EQ(escapeBytes({'a', ' ', '"', '\\', '\n', '\t', '\r', 0, 0x7f, 0xe2, '~'}),
            "a \\\"\\\\\\n\\t\\r\\x00\\x7f\\xe2~");
}

}  // namespace
}  // namespace pipeforge::train
