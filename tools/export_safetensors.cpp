// `pipeforge export CKPT --model MODEL.pt2 --out DIR --format safetensors
// [--like SRC] [--dtype D] [--max-shard-size 5GB]`.
#include <ATen/ATen.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "common/atomic_file.h"
#include "common/byte_size.h"
#include "common/safetensors.h"
#include "frontend/pipe_split_op.h"
#include "frontend/pt2_archive.h"
#include "frontend/pt2_weights.h"
#include "stage/value_meta.h"
#include "tools/export_model.h"

namespace pipeforge::train {
namespace {

namespace fs = std::filesystem;

// Note [Exporting safetensors]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// What save_pretrained writes, from a checkpoint, without the model in
// memory: the names are the checkpoint's FQNs, which for a transformers
// model are its state_dict names (Note [Weights by FQN]); the stage files
// are read one at a time, in stage order, each tensor written as the shard
// writer asks for it, so no process holds more than one stage's weights.
//
// What is written: every parameter, and every buffer the model's export
// declares persistent (its weights config; a non-persistent buffer such as
// rotary inv_freq is in no transformers checkpoint). Of a tied group one name
// is written, as save_pretrained drops the tied ones: the name --like's
// checkpoint holds, else the group's first in the model's order
// (model.embed_tokens.weight before lm_head.weight). Floats are converted to
// --dtype. --like copies config.json (its "dtype" set to what was written),
// generation_config.json and the tokenizer's files. When --like's checkpoint
// holds a renamed family's original layout (Mixtral's per-expert w1/w2/w3),
// the export writes that layout, as save_pretrained does.

const std::map<std::string, std::pair<at::ScalarType, const char*>>& dtypes() {
  static const std::map<std::string, std::pair<at::ScalarType, const char*>> kDtypes = {
      {"float32", {at::kFloat, "F32"}},  {"bfloat16", {at::kBFloat16, "BF16"}}, {"float16", {at::kHalf, "F16"}},
      {"float64", {at::kDouble, "F64"}}, {"int64", {at::kLong, "I64"}},         {"int32", {at::kInt, "I32"}},
      {"int16", {at::kShort, "I16"}},    {"int8", {at::kChar, "I8"}},           {"uint8", {at::kByte, "U8"}},
      {"bool", {at::kBool, "BOOL"}}};
  return kDtypes;
}

const std::vector<std::string>& likeFiles() {
  static const std::vector<std::string> kFiles = {
      "config.json",           "generation_config.json", "tokenizer.json", "tokenizer_config.json",
      "special_tokens_map.json", "tokenizer.model",      "vocab.json",     "vocab.txt",
      "merges.txt",            "added_tokens.json",      "chat_template.jinja"};
  return kFiles;
}

// Note [Checkpoint renames], backwards: the pieces of model tensor `name`
// under transformers' original layout (frontend::originalLayout), when
// --like's checkpoint holds every one of them; empty otherwise (the model's
// own name is written).
std::vector<frontend::OriginalPiece> likePieces(const std::string& name, const std::vector<std::int64_t>& shape,
                                                const SafetensorsSource& like) {
  std::vector<frontend::OriginalPiece> pieces = frontend::originalLayout(name, shape);
  for (const auto& piece : pieces) {
    if (like.find(piece.name) == nullptr) return {};
  }
  return pieces;
}

struct Planned {
  std::string name;
  int stage = 0;
  bool parameter = true;
  stage::ValueMeta meta;
};

}  // namespace

ExportSummary exportSafetensors(const ExportRequest& request) {
  std::error_code ec;
  if (request.out_path.empty()) throw CheckpointError("--format safetensors needs --out DIR (a folder to write)");
  if (fs::exists(request.out_path, ec) && !request.force) {
    throw CheckpointError(fmt::format("'{}' already exists; pass --force to replace it", request.out_path));
  }
  if (fs::is_regular_file(request.out_path, ec)) {
    throw CheckpointError(fmt::format("--out '{}' is a file; --format safetensors writes a folder (what "
                                      "save_pretrained writes): name a folder",
                                      request.out_path));
  }
  std::optional<at::ScalarType> to;
  std::string to_name;
  if (!request.dtype.empty()) {
    if (request.dtype != "float32" && request.dtype != "bfloat16" && request.dtype != "float16") {
      throw CheckpointError(fmt::format("--dtype '{}' is not one safetensors export writes; use float32, bfloat16 or "
                                        "float16",
                                        request.dtype));
    }
    to = dtypes().at(request.dtype).first;
    to_name = request.dtype;
  }
  const std::optional<double> shard = parseByteSize(request.max_shard_size);
  if (!shard || *shard < 1) {
    throw CheckpointError(fmt::format("--max-shard-size '{}' is not a size; write it as save_pretrained does: 5GB, "
                                      "500MB (powers of 1000) or 2GiB",
                                      request.max_shard_size));
  }
  std::optional<SafetensorsSource> like;
  if (!request.like.empty()) {
    if (!fs::is_directory(request.like, ec)) {
      throw CheckpointError(fmt::format("--like '{}' is not a folder; give the save_pretrained folder the run "
                                        "started from",
                                        request.like));
    }
    try {
      like.emplace(SafetensorsSource::open(request.like));
    } catch (const SafetensorsError& e) {
      throw CheckpointError(fmt::format("--like '{}': {}", request.like, e.what()));
    }
  }

  ExportSummary summary;
  summary.checkpoint_dir = resolveCheckpoint(request.checkpoint);
  verifyCheckpoint(summary.checkpoint_dir);
  const CheckpointMeta meta = readCheckpointMeta(summary.checkpoint_dir);
  summary.step = meta.step;

  // The model's order and which of its buffers persist (its export's
  // weights config); names only, so a meta export opens too.
  std::map<std::string, std::size_t> order;
  std::set<std::string> transient;
  if (!request.model_path.empty()) {
    frontend::ensurePipeSplitRegistered();
    frontend::Pt2OpenOptions options;
    options.need_values = false;
    const frontend::Pt2Archive archive = frontend::Pt2Archive::open(request.model_path, options);
    for (const auto& entry : archive.tensors()) {
      order.emplace(entry.fqn, order.size());
      if (entry.is_constant) transient.insert(entry.fqn);
    }
  }

  std::vector<Planned> planned;
  std::set<std::string> seen;
  for (int s = 0; s < meta.num_stages; ++s) {
    const StageIndex index = readStageIndex(summary.checkpoint_dir, s);
    for (bool parameter : {true, false}) {
      for (const auto& [name, desc] : parameter ? index.parameters : index.buffers) {
        if (!parameter && transient.count(name)) continue;
        if (!seen.insert(name).second) continue;  // a tied copy another stage holds under this name
        std::optional<stage::ValueMeta> value = stage::parseValueMeta(desc);
        if (!value || !dtypes().count(value->dtype)) {
          throw CheckpointError(fmt::format("checkpoint '{}' stage {}: '{}' is {}, which safetensors export does not "
                                            "write",
                                            summary.checkpoint_dir, s, name, desc));
        }
        planned.push_back({name, s, parameter, *value});
      }
    }
  }
  // One name per tied group.
  std::set<std::string> dropped;
  for (const auto& group : meta.tied) {
    std::vector<std::string> present;
    for (const auto& name : group) {
      if (seen.count(name)) present.push_back(name);
    }
    if (present.size() < 2) continue;
    std::string keep;
    if (like) {
      for (const auto& name : present) {
        if (like->find(name) != nullptr && keep.empty()) keep = name;
      }
    }
    if (keep.empty()) {
      keep = *std::min_element(present.begin(), present.end(), [&](const std::string& a, const std::string& b) {
        const std::size_t oa = order.count(a) ? order.at(a) : order.size();
        const std::size_t ob = order.count(b) ? order.at(b) : order.size();
        return oa != ob ? oa < ob : a < b;
      });
    }
    for (const auto& name : present) {
      if (name != keep) dropped.insert(name);
    }
    ++summary.tied_groups;
  }
  std::stable_sort(planned.begin(), planned.end(), [&](const Planned& a, const Planned& b) {
    if (a.stage != b.stage) return a.stage < b.stage;
    const std::size_t oa = order.count(a.name) ? order.at(a.name) : order.size();
    const std::size_t ob = order.count(b.name) ? order.at(b.name) : order.size();
    return oa < ob;
  });

  // The current stage's tensors: the one stage in memory.
  int loaded = -1;
  std::map<std::string, at::Tensor> stage_tensors;
  auto tensorOf = [&](const Planned& p) -> at::Tensor {
    if (loaded != p.stage) {
      stage_tensors.clear();
      StageCheckpoint state = readStageCheckpoint(summary.checkpoint_dir, p.stage);
      for (auto& [name, t] : state.parameters) stage_tensors[name] = t;
      for (auto& [name, t] : state.buffers) stage_tensors[name] = t;
      loaded = p.stage;
    }
    return stage_tensors.at(p.name);
  };

  std::vector<SafetensorsEntry> entries;
  std::string written_float;  // the dtype of the floats written, for config.json
  for (const Planned& p : planned) {
    if (dropped.count(p.name)) continue;
    auto [type, st_name] = dtypes().at(p.meta.dtype);
    const bool convert = to && at::isFloatingType(type) && *to != type;
    if (convert) {
      type = *to;
      st_name = dtypes().at(to_name).second;
    }
    if (at::isFloatingType(type) && written_float.empty()) {
      written_float = convert ? to_name : p.meta.dtype;
    }
    std::vector<frontend::OriginalPiece> pieces;
    if (like && like->find(p.name) == nullptr) pieces = likePieces(p.name, p.meta.shape, *like);
    if (pieces.empty()) pieces.push_back({p.name});
    for (const auto& piece : pieces) {
      // The piece's shape, from a zero-size stand-in of the tensor.
      const std::vector<std::int64_t> shape =
          frontend::pieceOf(at::empty_strided(p.meta.shape, std::vector<std::int64_t>(p.meta.shape.size(), 0),
                                              at::TensorOptions().dtype(at::kByte)),
                            piece)
              .sizes()
              .vec();
      std::int64_t numel = 1;
      for (std::int64_t d : shape) numel *= d;
      SafetensorsEntry e;
      e.name = piece.name;
      e.dtype = st_name;
      e.shape = shape;
      e.nbytes = static_cast<std::size_t>(numel) * c10::elementSize(type);
      e.fill = [&, p, type, piece](std::uint8_t* out) {
        const at::Tensor t = frontend::pieceOf(tensorOf(p), piece).to(type).contiguous();
        std::memcpy(out, t.data_ptr(), t.numel() * t.element_size());
      };
      entries.push_back(std::move(e));
    }
    (p.parameter ? summary.parameters : summary.buffers)++;
  }

  AtomicDirectory temp(fs::absolute(request.out_path).lexically_normal().string());  // Note [Atomic writes]
  try {
    writeSafetensorsFolder(temp.tempPath(), entries, static_cast<std::uint64_t>(*shard));
  } catch (const SafetensorsError& e) {
    throw CheckpointError(e.what(), e.code());
  }
  if (like) {
    for (const std::string& name : likeFiles()) {
      const fs::path from = fs::path(request.like) / name;
      if (!fs::is_regular_file(from, ec)) continue;
      std::ifstream in(from, std::ios::binary);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (name == "config.json" && !written_float.empty()) {
        // from_pretrained's dtype="auto" loads in the dtype the config names.
        try {
          nlohmann::ordered_json config = nlohmann::ordered_json::parse(text);
          config["dtype"] = written_float;
          if (config.contains("torch_dtype")) config["torch_dtype"] = written_float;
          text = config.dump(2) + "\n";
        } catch (const nlohmann::json::exception& e) {
          throw CheckpointError(fmt::format("--like '{}': config.json is not JSON ({})", request.like, e.what()));
        }
      }
      writeFileAtomically((fs::path(temp.tempPath()) / name).string(), text);
    }
  }
  temp.commit();
  return summary;
}

}  // namespace pipeforge::train
