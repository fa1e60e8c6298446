#include "data/token_dataset.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include "tests/support/zoo.h"

namespace pipeforge::train {
namespace {

namespace fs = std::filesystem;

class TokenDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::makeTempDir("pf-tokens"); }
  void TearDown() override { fs::remove_all(dir_); }

  // tokens[i] = i % modulo, as a nanoGPT .bin of `width` bytes per token.
  std::string writeTokens(const std::string& name, std::int64_t count, int width, std::int64_t modulo) {
    std::string path = dir_ + "/" + name;
    std::ofstream out(path, std::ios::binary);
    for (std::int64_t i = 0; i < count; ++i) {
      std::uint32_t v = static_cast<std::uint32_t>(i % modulo);
      out.write(reinterpret_cast<const char*>(&v), width);  // little endian
    }
    return path;
  }

  DataConfig config(const std::string& path, TokenDtype dtype, std::int64_t block) {
    DataConfig c;
    c.format = dtype == TokenDtype::kUint8 ? DataFormat::kText : DataFormat::kTokens;
    c.path = path;
    c.dtype = dtype;
    c.block_size = block;
    c.val_fraction = 0.25;
    return c;
  }

  std::string dir_;
};

TEST_F(TokenDatasetTest, WindowsAreShiftedByOne) {
  for (auto [dtype, width, modulo] : {std::tuple{TokenDtype::kUint16, 2, 60000}, {TokenDtype::kUint32, 4, 100000},
                                      {TokenDtype::kUint8, 1, 256}}) {
    TokenDataset data(config(writeTokens("t.bin", 1000, width, modulo), dtype, 8), 1);
    EXPECT_EQ(data.trainTokens(), 750);
    EXPECT_EQ(data.heldOutTokens(), 250);
    Batch b = data.batch(DataSplit::kTrain, 3, 5);
    ASSERT_EQ(b.inputs.size(), 1u);
    EXPECT_EQ(b.inputs[0].sizes(), (std::vector<std::int64_t>{5, 8}));
    EXPECT_EQ(b.inputs[0].scalar_type(), at::kLong);
    // Consecutive tokens: y = x + 1 (mod the pattern), and windows stay in the training part.
    EXPECT_TRUE(at::equal(b.targets[0], (b.inputs[0] + 1).remainder(modulo)));
    if (modulo < 1000) continue;  // bytes wrap around: positions are not values
    EXPECT_LE(b.targets[0].max().item<std::int64_t>(), 749);
    Batch held = data.batch(DataSplit::kHeldOut, 0, 5);
    EXPECT_GE(held.inputs[0].min().item<std::int64_t>(), 750);
  }
}

TEST_F(TokenDatasetTest, SameSeedAndStepSameBatch) {
  std::string path = writeTokens("t.bin", 5000, 2, 5000);
  TokenDataset a(config(path, TokenDtype::kUint16, 16), 7);
  TokenDataset b(config(path, TokenDtype::kUint16, 16), 7);
  TokenDataset c(config(path, TokenDtype::kUint16, 16), 8);
  EXPECT_TRUE(at::equal(a.batch(DataSplit::kTrain, 5, 4).inputs[0], b.batch(DataSplit::kTrain, 5, 4).inputs[0]));
  EXPECT_FALSE(at::equal(a.batch(DataSplit::kTrain, 5, 4).inputs[0], a.batch(DataSplit::kTrain, 6, 4).inputs[0]));
  EXPECT_FALSE(at::equal(a.batch(DataSplit::kTrain, 5, 4).inputs[0], c.batch(DataSplit::kTrain, 5, 4).inputs[0]));
}

TEST_F(TokenDatasetTest, TooShortOrRaggedFilesAreRefused) {
  EXPECT_THROW(TokenDataset(config(writeTokens("short.bin", 8, 2, 10), TokenDtype::kUint16, 8), 1), ConfigError);
  std::string ragged = dir_ + "/ragged.bin";
  std::ofstream(ragged, std::ios::binary) << std::string(101, 'x');
  try {
    TokenDataset(config(ragged, TokenDtype::kUint16, 8), 1);
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("not a whole number of 2-byte tokens"), std::string::npos) << e.what();
  }
}

// Note [Variable sequence lengths]: one document per row, cut at block + 1
// tokens, inputs padded with the separator and targets with -1; every
// document once per epoch.
TEST_F(TokenDatasetTest, PackingNoneGivesOneDocumentPerRow) {
  // Documents (separator 0): [5 6 7 0] [8 0] [9 10 11 12 13 14 15 0] [0: one token, skipped] [16 17]
  const std::vector<std::uint32_t> tokens = {5, 6, 7, 0, 8, 0, 9, 10, 11, 12, 13, 14, 15, 0, 0, 16, 17};
  const std::string path = dir_ + "/docs.bin";
  {
    std::ofstream out(path, std::ios::binary);
    for (std::uint32_t v : tokens) out.write(reinterpret_cast<const char*>(&v), 2);
  }
  DataConfig c = config(path, TokenDtype::kUint16, 5);
  c.val_fraction = 0.0;
  c.packing = Packing::kNone;
  c.document_separator = 0;
  TokenDataset data(c, 3);
  EXPECT_NE(data.describe().find("one document per row (packing none: 4 train, 0 held out, the longest 8 tokens)"),
            std::string::npos)
      << data.describe();
  // The rows each document makes, by its first token.
  const std::map<std::int64_t, std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>>> want = {
      {5, {{5, 6, 7, 0, 0}, {6, 7, 0, -1, -1}}},
      {8, {{8, 0, 0, 0, 0}, {0, -1, -1, -1, -1}}},
      {9, {{9, 10, 11, 12, 13}, {10, 11, 12, 13, 14}}},  // cut at block + 1 tokens
      {16, {{16, 0, 0, 0, 0}, {17, -1, -1, -1, -1}}},
  };
  std::map<std::int64_t, int> seen;
  for (std::int64_t step = 0; step < 2; ++step) {  // two batches of 2: one epoch of 4 documents
    const Batch b = data.batch(DataSplit::kTrain, step, 2);
    ASSERT_EQ(b.inputs[0].sizes(), (std::vector<std::int64_t>{2, 5}));
    for (std::int64_t r = 0; r < 2; ++r) {
      const at::Tensor x = b.inputs[0][r], y = b.targets[0][r];
      const auto it = want.find(x[0].item<std::int64_t>());
      ASSERT_NE(it, want.end()) << x;
      EXPECT_TRUE(at::equal(x, at::tensor(it->second.first, at::kLong))) << x;
      EXPECT_TRUE(at::equal(y, at::tensor(it->second.second, at::kLong))) << y;
      ++seen[it->first];
    }
  }
  EXPECT_EQ(seen.size(), 4u);  // each document once in the epoch
  c.document_separator = 99;  // never in the stream: the whole stream is one document
  EXPECT_NO_THROW(TokenDataset(c, 3));
  const std::string lone = dir_ + "/lone.bin";
  {
    std::ofstream out(lone, std::ios::binary);
    for (std::uint32_t v : {0u, 0u, 0u}) out.write(reinterpret_cast<const char*>(&v), 2);
  }
  c.path = lone;
  c.document_separator = 0;
  try {
    TokenDataset(c, 3);
    ADD_FAILURE() << "a stream of separators was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("holds no document of two or more tokens"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pipeforge::train
