#include "data/tensor_dataset.h"

#include <torch/script.h>
#include <torch/serialize.h>

#include <filesystem>
#include <fstream>
#include <algorithm>
#include <iterator>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "data/sampling.h"

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

namespace {

// The file's inputs in the model's order: a dict by name is mapped onto
// layout.input_names; a tensor or tuple is positional.
std::vector<at::Tensor> modelInputs(const c10::IValue& value, const DataLayout& layout, const std::string& what) {
  if (!value.isGenericDict()) return tensorsOf(value, what);
  std::vector<std::string> keys;
  std::map<std::string, at::Tensor> by_name;
  for (const auto& kv : value.toGenericDict()) {
    if (!kv.key().isString() || !kv.value().isTensor()) {
      throw ConfigError(fmt::format("{} is a dict; it must map input names (strings) to tensors, got {} -> {}", what,
                                    kv.key().tagKind(), kv.value().tagKind()));
    }
    keys.push_back(kv.key().toStringRef());
    by_name[keys.back()] = kv.value().toTensor();
  }
  const std::string model = fmt::format("[{}]", fmt::join(layout.input_names, ", "));
  const std::string file = fmt::format("[{}]", fmt::join(keys, ", "));
  if (layout.input_names.empty()) {
    throw ConfigError(fmt::format("{} is a dict by input name {}, but the model's input names are not known here; "
                                  "give the inputs as a tuple in the model's order",
                                  what, file));
  }
  for (const auto& key : keys) {
    if (std::find(layout.input_names.begin(), layout.input_names.end(), key) == layout.input_names.end()) {
      throw ConfigError(fmt::format("{} has key '{}', which is not an input of the model; the model's inputs are {}, "
                                    "the file's keys {}: rename the key",
                                    what, key, model, file));
    }
  }
  std::vector<at::Tensor> out;
  for (const auto& name : layout.input_names) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      throw ConfigError(fmt::format("{} has no key '{}', an input of the model; the model's inputs are {}, the file's "
                                    "keys {}: add it",
                                    what, name, model, file));
    }
    out.push_back(it->second);
  }
  return out;
}

// Every split tensor has the same number of rows along its row dim (Note
// [Input chunks] in data/data_layout.h); returns it.
std::int64_t countRows(const Batch& batch, const DataLayout& layout, const std::string& where) {
  std::int64_t rows = -1;
  std::string first;
  auto visit = [&](const std::vector<at::Tensor>& list, const std::vector<ChunkEntry>& specs, const char* kind,
                   const char* key) {
    for (std::size_t k = 0; k < list.size(); ++k) {
      const ChunkEntry spec = k < specs.size() ? specs[k] : ChunkEntry{};
      if (spec.replicate) continue;
      const at::Tensor& t = list[k];
      const std::string name =
          std::string(kind) == "input" && k < layout.input_names.size()
              ? fmt::format("input '{}'", layout.input_names[k])
              : fmt::format("{} {}", kind, k);
      if (spec.dim >= t.dim()) {
        throw ConfigError(fmt::format("{}: {} has shape {} with no dim {} to hold its rows; {} (pipeline.{}) must "
                                      "name one of its dims or be replicate",
                                      where, name, c10::str(t.sizes()), spec.dim, name, key));
      }
      if (rows < 0) {
        rows = t.size(spec.dim);
        first = fmt::format("{} has {} along dim {}", name, rows, spec.dim);
      } else if (t.size(spec.dim) != rows) {
        throw ConfigError(fmt::format("{}: every tensor needs the same rows along dim 0 (or along the dim "
                                      "pipeline.input_chunks / target_chunks give it), but {} and {} has shape {} (row "
                                      "dim {}); fix the data or pipeline.{}",
                                      where, first, name, c10::str(t.sizes()), spec.dim, key));
      }
    }
  };
  visit(batch.inputs, layout.inputs, "input", "input_chunks");
  visit(batch.targets, layout.targets, "target", "target_chunks");
  if (rows < 0) {
    throw ConfigError(fmt::format("{}: every input and target is replicate, so no tensor has rows to draw batches "
                                  "from; split at least one (pipeline.input_chunks / target_chunks)",
                                  where));
  }
  return rows;
}

}  // namespace

Batch loadTensorFile(const std::string& path, const std::string& key, const DataLayout& layout) {
  const std::string form_hint =
      "save it with torch.save({'inputs': x, 'targets': y}, path) (zip format, several tensors as a tuple or a dict "
      "by input name) or as a TorchScript module with attributes inputs and targets";
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
    batch.inputs = modelInputs(holder.attr("inputs"), layout, fmt::format("{}: '{}' attribute inputs", key, path));
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
    batch.inputs = modelInputs(dict.at("inputs"), layout, fmt::format("{}: '{}' key inputs", key, path));
    batch.targets = tensorsOf(dict.at("targets"), fmt::format("{}: '{}' key targets", key, path));
  }
  if (!layout.inputs.empty() && layout.inputs.size() != batch.inputs.size()) {
    throw ConfigError(fmt::format("{}: '{}' holds {} inputs but pipeline.input_chunks has {} entries, one per model "
                                  "input [{}]",
                                  key, path, batch.inputs.size(), layout.inputs.size(),
                                  fmt::join(layout.input_names, ", ")));
  }
  if (!layout.targets.empty() && layout.targets.size() != batch.targets.size()) {
    throw ConfigError(fmt::format("{}: '{}' holds {} targets but pipeline.target_chunks has {} entries; give one "
                                  "per target",
                                  key, path, batch.targets.size(), layout.targets.size()));
  }
  const std::string where = fmt::format("{}: '{}'", key, path);
  if (countRows(batch, layout, where) == 0) throw ConfigError(fmt::format("{} has no rows", where));
  return batch;
}

class TensorDataset::Impl {
 public:
  Impl(const DataConfig& config, std::uint64_t seed, const DataLayout& layout)
      : config_(config), seed_(seed), layout_(layout) {
    Batch all = loadTensorFile(config.path, "data.path", layout_);
    rows_ = rowsOf(all);
    if (!config.val_path.empty()) {
      train_ = std::move(all);
      held_out_ = loadTensorFile(config.val_path, "data.val_path", layout_);
    } else {
      const auto held = static_cast<std::int64_t>(static_cast<double>(rows_) * config.val_fraction);
      train_ = sliceBatch(all, 0, rows_ - held, layout_);
      held_out_ = sliceBatch(all, rows_ - held, rows_, layout_);
    }
    if (rowsOf(train_) == 0) {
      throw ConfigError(fmt::format("data.val_fraction {} leaves no training rows out of {}", config.val_fraction, rows_));
    }
  }

  Batch batch(DataSplit split, std::int64_t index, std::int64_t batch_size) {
    const Batch& source = split == DataSplit::kTrain ? train_ : held_out_;
    const std::int64_t n = rowsOf(source);
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
    // Note [Input chunks]: split tensors are indexed along their row dim, replicated ones taken whole.
    auto draw = [&](const std::vector<at::Tensor>& from, const std::vector<ChunkEntry>& specs, std::vector<at::Tensor>& to) {
      for (std::size_t k = 0; k < from.size(); ++k) {
        const ChunkEntry spec = k < specs.size() ? specs[k] : ChunkEntry{};
        to.push_back(spec.replicate ? from[k] : from[k].index_select(spec.dim, rows));
      }
    };
    Batch out;
    draw(source.inputs, layout_.inputs, out.inputs);
    draw(source.targets, layout_.targets, out.targets);
    return out;
  }

  std::string describe() const {
    return fmt::format("{}: {} rows ({} train, {} held out{}), {} inputs, {} targets",
                       std::filesystem::path(config_.path).filename().string(), rows_, rowsOf(train_),
                       held_out_.inputs.empty() ? 0 : rowsOf(held_out_), heldOutFrom(config_),
                       train_.inputs.size(), train_.targets.size());
  }

 private:
  // Rows of a batch: along the row dim of its first split tensor.
  std::int64_t rowsOf(const Batch& b) const {
    auto first = [&](const std::vector<at::Tensor>& list, const std::vector<ChunkEntry>& specs) -> std::int64_t {
      for (std::size_t k = 0; k < list.size(); ++k) {
        const ChunkEntry spec = k < specs.size() ? specs[k] : ChunkEntry{};
        if (!spec.replicate) return list[k].size(spec.dim);
      }
      return -1;
    };
    const std::int64_t n = first(b.inputs, layout_.inputs);
    return n >= 0 ? n : first(b.targets, layout_.targets);
  }

  // The row order of one epoch: a Fisher-Yates shuffle drawn from (seed, epoch).
  const std::vector<std::int64_t>& order(std::uint64_t stream, std::int64_t epoch, std::int64_t n) {
    return order_.get(seed_, stream + 2, epoch, n);
  }

  DataConfig config_;
  std::uint64_t seed_;
  DataLayout layout_;
  std::int64_t rows_ = 0;
  Batch train_;
  Batch held_out_;
  EpochOrder order_;
};

TensorDataset::TensorDataset(const DataConfig& config, std::uint64_t seed, const DataLayout& layout)
    : impl_(std::make_unique<Impl>(config, seed, layout)) {}
TensorDataset::~TensorDataset() = default;

Batch TensorDataset::batch(DataSplit split, std::int64_t index, std::int64_t batch_size) {
  return impl_->batch(split, index, batch_size);
}
std::string TensorDataset::describe() const { return impl_->describe(); }

}  // namespace pipeforge::train
