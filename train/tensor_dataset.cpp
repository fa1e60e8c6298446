#include "train/tensor_dataset.h"

#include <torch/script.h>
#include <torch/serialize.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>

#include <fmt/format.h>

#include "train/sampling.h"

namespace pipeforge::train {
namespace {

// A tensor, or a tuple / list of tensors, as a list.
std::vector<at::Tensor> tensorsOf(const c10::IValue& value, const std::string& what) {
  if (value.isTensor()) return {value.toTensor()};
  std::vector<c10::IValue> items;
  if (value.isTuple()) {
    items = value.toTupleRef().elements().vec();
  } else if (value.isList()) {
    items = value.toListRef().vec();
  } else {
    throw ConfigError(fmt::format("{} must be a tensor or a tuple of tensors, got {}", what, value.tagKind()));
  }
  std::vector<at::Tensor> out;
  for (const auto& item : items) {
    if (!item.isTensor()) throw ConfigError(fmt::format("{} holds a {}; every item must be a tensor", what, item.tagKind()));
    out.push_back(item.toTensor());
  }
  if (out.empty()) throw ConfigError(fmt::format("{} is empty", what));
  return out;
}

bool isZipArchive(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[2] = {0, 0};
  in.read(magic, 2);
  return magic[0] == 'P' && magic[1] == 'K';
}

bool isTorchScriptArchive(const std::string& path) {
  // TorchScript archives carry code; torch.save archives carry only data.pkl.
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    return reader.hasRecord("constants.pkl") || reader.hasRecord("code/__torch__.py");
  } catch (const c10::Error&) {
    return false;
  }
}

}  // namespace

Batch loadTensorFile(const std::string& path, const std::string& key) {
  const std::string form_hint =
      "save it with torch.save({'inputs': x, 'targets': y}, path) (zip format, several tensors as a tuple) or as a "
      "TorchScript module with attributes inputs and targets";
  if (!isZipArchive(path)) {
    throw ConfigError(fmt::format("{}: '{}' is not a zip archive (a legacy torch.save pickle cannot be read from "
                                  "C++); {}",
                                  key, path, form_hint));
  }
  Batch batch;
  if (isTorchScriptArchive(path)) {
    torch::jit::Module holder;
    try {
      holder = torch::jit::load(path, c10::Device(c10::kCPU));
    } catch (const c10::Error& e) {
      throw ConfigError(fmt::format("{}: cannot load TorchScript archive '{}': {}", key, path, e.what_without_backtrace()));
    }
    for (const char* name : {"inputs", "targets"}) {
      if (!holder.hasattr(name)) {
        throw ConfigError(fmt::format("{}: the module in '{}' has no attribute '{}'; {}", key, path, name, form_hint));
      }
    }
    batch.inputs = tensorsOf(holder.attr("inputs"), fmt::format("{}: '{}' attribute inputs", key, path));
    batch.targets = tensorsOf(holder.attr("targets"), fmt::format("{}: '{}' attribute targets", key, path));
  } else {
    std::ifstream in(path, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    c10::IValue value;
    try {
      value = torch::pickle_load(bytes);
    } catch (const c10::Error& e) {
      throw ConfigError(fmt::format("{}: '{}' cannot be unpickled in C++ (lists inside the dict are a common cause: "
                                    "use tuples); {}",
                                    key, path, form_hint));
    }
    if (!value.isGenericDict()) {
      throw ConfigError(fmt::format("{}: '{}' holds a {}, not a dict; {}", key, path, value.tagKind(), form_hint));
    }
    auto dict = value.toGenericDict();
    for (const char* name : {"inputs", "targets"}) {
      if (!dict.contains(name)) throw ConfigError(fmt::format("{}: '{}' has no key '{}'; {}", key, path, name, form_hint));
    }
    batch.inputs = tensorsOf(dict.at("inputs"), fmt::format("{}: '{}' key inputs", key, path));
    batch.targets = tensorsOf(dict.at("targets"), fmt::format("{}: '{}' key targets", key, path));
  }
  const std::int64_t rows = batch.inputs[0].dim() > 0 ? batch.inputs[0].size(0) : 0;
  for (const auto* list : {&batch.inputs, &batch.targets}) {
    for (const auto& t : *list) {
      if (t.dim() == 0 || t.size(0) != rows) {
        throw ConfigError(fmt::format("{}: '{}': every tensor needs the rows along dim 0; inputs[0] has {} rows but "
                                      "another tensor has shape {}",
                                      key, path, rows, c10::str(t.sizes())));
      }
    }
  }
  if (rows == 0) throw ConfigError(fmt::format("{}: '{}' has no rows", key, path));
  return batch;
}

class TensorDataset::Impl {
 public:
  Impl(const DataConfig& config, std::uint64_t seed) : config_(config), seed_(seed) {
    Batch all = loadTensorFile(config.path, "data.path");
    rows_ = all.inputs[0].size(0);
    if (!config.val_path.empty()) {
      train_ = std::move(all);
      held_out_ = loadTensorFile(config.val_path, "data.val_path");
    } else {
      const auto held = static_cast<std::int64_t>(static_cast<double>(rows_) * config.val_fraction);
      train_ = sliceBatch(all, 0, rows_ - held);
      held_out_ = sliceBatch(all, rows_ - held, rows_);
    }
    if (train_.inputs[0].size(0) == 0) {
      throw ConfigError(fmt::format("data.val_fraction {} leaves no training rows out of {}", config.val_fraction, rows_));
    }
  }

  Batch batch(DataSplit split, std::int64_t index, std::int64_t batch_size) {
    const Batch& source = split == DataSplit::kTrain ? train_ : held_out_;
    const std::int64_t n = source.inputs[0].size(0);
    if (n == 0) {
      throw ConfigError("evaluation needs held-out data: set data.val_path or data.val_fraction > 0, or "
                        "training.eval_every: 0");
    }
    at::Tensor rows = at::empty({batch_size}, at::kLong);
    auto* p = rows.data_ptr<std::int64_t>();
    const std::uint64_t stream = split == DataSplit::kTrain ? 0 : 1;
    for (std::int64_t j = 0; j < batch_size; ++j) {
      const std::int64_t k = index * batch_size + j;  // position in the endless sequence of rows
      p[j] = order(stream, k / n, n)[k % n];
    }
    Batch out;
    for (const auto& t : source.inputs) out.inputs.push_back(t.index_select(0, rows));
    for (const auto& t : source.targets) out.targets.push_back(t.index_select(0, rows));
    return out;
  }

  std::string describe() const {
    return fmt::format("{}: {} rows ({} train, {} held out{}), {} inputs, {} targets",
                       std::filesystem::path(config_.path).filename().string(), rows_, train_.inputs[0].size(0),
                       held_out_.inputs.empty() ? 0 : held_out_.inputs[0].size(0), heldOutFrom(config_),
                       train_.inputs.size(), train_.targets.size());
  }

 private:
  // The row order of one epoch: a Fisher-Yates shuffle drawn from (seed, epoch).
  const std::vector<std::int64_t>& order(std::uint64_t stream, std::int64_t epoch, std::int64_t n) {
    if (cached_stream_ == stream && cached_epoch_ == epoch && static_cast<std::int64_t>(cached_.size()) == n) {
      return cached_;
    }
    cached_.resize(n);
    std::iota(cached_.begin(), cached_.end(), 0);
    for (std::int64_t i = n - 1; i > 0; --i) {
      auto j = static_cast<std::int64_t>(drawBelow(
          drawBits(seed_, stream + 2, static_cast<std::uint64_t>(epoch), static_cast<std::uint64_t>(i)),
          static_cast<std::uint64_t>(i + 1)));
      std::swap(cached_[i], cached_[j]);
    }
    cached_stream_ = stream;
    cached_epoch_ = epoch;
    return cached_;
  }

  DataConfig config_;
  std::uint64_t seed_;
  std::int64_t rows_ = 0;
  Batch train_;
  Batch held_out_;
  std::uint64_t cached_stream_ = ~0ull;
  std::int64_t cached_epoch_ = -1;
  std::vector<std::int64_t> cached_;
};

TensorDataset::TensorDataset(const DataConfig& config, std::uint64_t seed)
    : impl_(std::make_unique<Impl>(config, seed)) {}
TensorDataset::~TensorDataset() = default;

Batch TensorDataset::batch(DataSplit split, std::int64_t index, std::int64_t batch_size) {
  return impl_->batch(split, index, batch_size);
}
std::string TensorDataset::describe() const { return impl_->describe(); }

}  // namespace pipeforge::train
