#include "data/token_dataset.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <fstream>

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

}  // namespace
}  // namespace pipeforge::train
