#include "runtime/microbatch.h"

#include <gtest/gtest.h>
#include <torch/script.h>

#include "runtime/loss.h"

namespace pipeforge::runtime {
namespace {

TEST(MicrobatchTest, SplitsLikeTensorSplitAndReplicates) {
  at::Tensor x = torch::arange(14).view({7, 2});
  at::Tensor w = torch::ones({3});
  auto mbs = splitIntoMicrobatches({x, w}, {ChunkSpec::split(0), ChunkSpec::replicated()}, 3, "input");
  ASSERT_EQ(mbs.size(), 3u);
  EXPECT_EQ(mbs[0][0].size(0), 3);  // 7 rows: 3, 2, 2 (larger first)
  EXPECT_EQ(mbs[1][0].size(0), 2);
  EXPECT_EQ(mbs[2][0].size(0), 2);
  for (const auto& mb : mbs) EXPECT_TRUE(mb[1].is_same(w));
  std::vector<std::vector<at::Tensor>> firsts;
  for (const auto& mb : mbs) firsts.push_back({mb[0]});
  EXPECT_TRUE(torch::equal(mergeMicrobatches(firsts, 0)[0], x));
}

TEST(MicrobatchTest, SplitsAlongAnotherDim) {
  at::Tensor x = torch::randn({2, 8});
  auto mbs = splitIntoMicrobatches({x}, {ChunkSpec::split(1)}, 4, "input");
  EXPECT_EQ(mbs[3][0].sizes(), (std::vector<int64_t>{2, 2}));
}

// Note [Variable sequence lengths]: each microbatch is cut to its longest
// row (the last column with a counted target), at least 2, and eval outputs
// are padded back with zeros.
TEST(MicrobatchTest, TrimsEachMicrobatchToItsLongestRow) {
  at::Tensor x = torch::arange(4 * 6).view({4, 6});
  at::Tensor y = torch::full({4, 6}, -1, at::kLong);
  y[0].narrow(0, 0, 4).fill_(1);  // microbatch 0: rows of 4 and 2 targets
  y[1].narrow(0, 0, 2).fill_(1);
  y[2][0] = 1;  // microbatch 1: one target only, kept at length 2
  auto inputs = splitIntoMicrobatches({x}, {}, 2, "input");
  auto targets = splitIntoMicrobatches({y}, {}, 2, "target");
  const std::vector<std::int64_t> lengths = trimPadding(inputs, targets);
  EXPECT_EQ(lengths, (std::vector<std::int64_t>{4, 2}));
  EXPECT_TRUE(torch::equal(inputs[0][0], x.narrow(0, 0, 2).narrow(1, 0, 4)));
  EXPECT_TRUE(torch::equal(targets[1][0], y.narrow(0, 2, 2).narrow(1, 0, 2)));
  EXPECT_TRUE(inputs[0][0].is_contiguous());
  std::vector<std::vector<at::Tensor>> outs = {{inputs[0][0].to(at::kFloat)}, {inputs[1][0].to(at::kFloat)}};
  padToLength(outs, lengths, 6);
  const at::Tensor merged = mergeMicrobatches(outs, 0)[0];
  EXPECT_EQ(merged.sizes(), (std::vector<std::int64_t>{4, 6}));
  EXPECT_TRUE(torch::equal(merged.narrow(1, 0, 2), x.narrow(1, 0, 2).to(at::kFloat)));
  EXPECT_EQ(merged[2][4].item<float>(), 0.0f);  // padding comes back as zeros
  // A [batch, seq] input of another length than the targets is named.
  auto bad_inputs = splitIntoMicrobatches({torch::zeros({4, 5})}, {}, 2, "input");
  auto again = splitIntoMicrobatches({y}, {}, 2, "target");
  try {
    trimPadding(bad_inputs, again);
    FAIL() << "no error";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("input 0 has length 5 along dim 1 but the targets 6"), std::string::npos)
        << e.what();
  }
}

TEST(MicrobatchTest, ExplainsBadSplits) {
  try {
    splitIntoMicrobatches({torch::randn({3, 2})}, {}, 4, "input");
    FAIL() << "no error";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("input 0 has 3 rows along dim 0, fewer than the 4 microbatches"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(splitIntoMicrobatches({torch::randn({3})}, {ChunkSpec::split(1)}, 1, "target"), RuntimeError);
  EXPECT_THROW(splitIntoMicrobatches({torch::randn({3})}, {ChunkSpec{}, ChunkSpec{}}, 1, "target"), RuntimeError);
}

TEST(LossTest, CrossEntropyFlattensAsNanoGpt) {
  torch::manual_seed(0);
  at::Tensor logits = torch::randn({2, 5, 7});
  at::Tensor targets = torch::randint(0, 7, {2, 5});
  targets[0][1] = -1;  // ignored
  at::Tensor got = LossFunction(LossKind::kCrossEntropy, "", "cpu")({logits}, {targets});
  at::Tensor want = at::cross_entropy_loss(logits.view({10, 7}), targets.view({10}), {}, at::Reduction::Mean, -1);
  EXPECT_TRUE(torch::allclose(got, want));
  EXPECT_THROW(LossFunction(LossKind::kCrossEntropy, "", "cpu")({logits}, {torch::zeros({3})}), RuntimeError);
}

TEST(LossTest, MseSumsOverTheTargetsGiven) {
  at::Tensor a = torch::ones({2, 3}), b = torch::zeros({4});
  at::Tensor got = LossFunction(LossKind::kMse, "", "cpu")({a, b}, {torch::zeros({2, 3}), torch::ones({4})});
  EXPECT_DOUBLE_EQ(got.item<double>(), 2.0);
  EXPECT_THROW(LossFunction(LossKind::kScript, "", "cpu"), RuntimeError);
}

}  // namespace
}  // namespace pipeforge::runtime
