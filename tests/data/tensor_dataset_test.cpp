#include "data/tensor_dataset.h"

#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/serialize.h>

#include <filesystem>
#include <fstream>

#include "tests/support/zoo.h"

namespace pipeforge::train {
namespace {

namespace fs = std::filesystem;

class TensorDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::makeTempDir("pf-tensors"); }
  void TearDown() override { fs::remove_all(dir_); }

  // torch.save({"inputs": x, "targets": y}) as C++ writes it (the same zip pickle).
  std::string writePickle(const at::Tensor& x, const at::Tensor& y) {
    c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
    dict.insert("inputs", x);
    dict.insert("targets", y);
    auto bytes = torch::pickle_save(dict);
    std::string path = dir_ + "/data.pt";
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path;
  }

  DataConfig config(const std::string& path) {
    DataConfig c;
    c.format = DataFormat::kTensors;
    c.path = path;
    c.val_fraction = 0.2;
    return c;
  }

  std::string dir_;
};

TEST_F(TensorDatasetTest, EveryRowOncePerEpoch) {
  at::Tensor x = at::arange(10, at::kFloat).unsqueeze(1);
  TensorDataset data(config(writePickle(x, x * 2)), 3);
  std::vector<float> seen;
  for (int step = 0; step < 4; ++step) {  // 8 training rows, 2 per step: one epoch
    Batch b = data.batch(DataSplit::kTrain, step, 2);
    EXPECT_TRUE(at::equal(b.targets[0], b.inputs[0] * 2));
    for (int k = 0; k < 2; ++k) seen.push_back(b.inputs[0][k][0].item<float>());
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
  Batch held = data.batch(DataSplit::kHeldOut, 0, 2);
  EXPECT_GE(held.inputs[0].min().item<float>(), 8.0f);
}

TEST_F(TensorDatasetTest, TorchScriptHolderWithLists) {
  torch::jit::Module holder("Holder");
  std::vector<at::Tensor> inputs = {at::ones({6, 3}), at::zeros({6, 2})};
  c10::List<at::Tensor> list(inputs);
  holder.register_attribute("inputs", c10::ListType::ofTensors(), list);
  holder.register_attribute("targets", c10::TensorType::get(), at::arange(6));
  std::string path = dir_ + "/holder.pt";
  holder.save(path);
  Batch all = loadTensorFile(path, "data.path");
  ASSERT_EQ(all.inputs.size(), 2u);
  EXPECT_EQ(all.inputs[1].size(1), 2);
  EXPECT_EQ(all.targets[0].size(0), 6);
}

TEST_F(TensorDatasetTest, UnreadableFormsSayHowToSave) {
  std::string legacy = dir_ + "/legacy.pt";
  std::ofstream(legacy, std::ios::binary) << "\x80\x02legacy pickle";
  try {
    loadTensorFile(legacy, "data.path");
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("not a zip archive"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("torch.save({'inputs'"), std::string::npos) << e.what();
  }
  try {
    loadTensorFile(writePickle(at::ones({4, 2}), at::ones({3})), "data.path");
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("rows along dim 0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pipeforge::train
