#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/optim.h>
#include <torch/serialize.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "stage/file_digest.h"
#include "stage/value_meta.h"

namespace pipeforge::train {
namespace {

namespace fs = std::filesystem;

std::string stageFile(int stage) { return fmt::format("stage_{}.pt", stage); }
std::string indexFile(int stage) { return fmt::format("stage_{}.json", stage); }
std::string optimizerFile(int stage) { return fmt::format("stage_{}.optim.pt", stage); }  // format 1

// The pickled form of a stage's optimizer state: {"name": "adamw", "state":
// {FQN: {"step": 3, "exp_avg": tensor, "exp_avg_sq": tensor}}}, what
// torch.load gives a plain-PyTorch reader.
c10::IValue optimizerToIValue(const StageOptimizerState& optimizer) {
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [name, p] : optimizer.by_name) {
    c10::impl::GenericDict slots(c10::StringType::get(), c10::AnyType::get());
    if (p.step) slots.insert("step", *p.step);
    for (const auto& [slot, t] : p.slots) slots.insert(slot, t.detach().to(at::kCPU).clone());
    state.insert(name, slots);
  }
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("name", optimizer.name);
  dict.insert("state", state);
  return dict;
}

StageOptimizerState optimizerFromIValue(const c10::IValue& value, const std::string& path) {
  auto bad = [&](const std::string& what) {
    return CheckpointError(fmt::format("'{}': the optimizer state is malformed ({})", path, what));
  };
  if (!value.isGenericDict()) throw bad("not a dict");
  auto dict = value.toGenericDict();
  if (!dict.contains("name") || !dict.at("name").isString()) throw bad("no name");
  if (!dict.contains("state") || !dict.at("state").isGenericDict()) throw bad("no state dict");
  StageOptimizerState out;
  out.name = dict.at("name").toStringRef();
  for (const auto& kv : dict.at("state").toGenericDict()) {
    if (!kv.key().isString() || !kv.value().isGenericDict()) throw bad("a parameter's entry is not a dict");
    ParameterOptimizerState p;
    for (const auto& slot : kv.value().toGenericDict()) {
      const std::string key = slot.key().toStringRef();
      if (key == "step" && slot.value().isInt()) {
        p.step = slot.value().toInt();
      } else if (slot.value().isTensor()) {
        p.slots.emplace_back(key, slot.value().toTensor());
      } else {
        throw bad(fmt::format("'{}' of '{}'", key, kv.key().toStringRef()));
      }
    }
    out.by_name.emplace(kv.key().toStringRef(), std::move(p));
  }
  return out;
}

// The slots every parameter of a sharded stage holds: those of its pieces
// (every piece of a stage steps together), so that each rank writes the
// same index whether or not it holds a piece of every parameter.
std::map<std::string, std::vector<std::string>> shardedStateIndex(const StageCheckpoint& state) {
  std::vector<std::string> slots;
  for (const auto& [name, p] : state.optimizer_shard->optimizer.by_name) {
    if (p.step) slots.push_back("step");
    for (const auto& slot : p.slots) slots.push_back(slot.first);
    break;
  }
  std::map<std::string, std::vector<std::string>> out;
  if (slots.empty()) return out;
  for (const auto& [name, range] : state.optimizer_shard->ranges) out[name] = slots;
  return out;
}

bool shardsParameters(const StageCheckpoint& state) {
  return state.optimizer_shard && !state.optimizer_shard->shapes.empty();
}

nlohmann::json stageIndexJson(const StageCheckpoint& state) {
  nlohmann::json j;
  j["stage"] = state.stage;
  j["step"] = state.step;
  j["parameters"] = nlohmann::json::object();
  for (const auto& [name, t] : state.parameters) j["parameters"][name] = stage::tensorMeta(t);
  if (shardsParameters(state)) {
    const OptimizerShard& shard = *state.optimizer_shard;
    for (const auto& [name, piece] : shard.parameters) {
      // The whole tensor's dtype and shape, without making it.
      j["parameters"][name] = stage::tensorMeta(at::empty(shard.shapes.at(name), piece.options().device(at::kMeta)));
    }
    j["parameter_shards"] = shard.shards;
  }
  j["buffers"] = nlohmann::json::object();
  for (const auto& [name, t] : state.buffers) j["buffers"][name] = stage::tensorMeta(t);
  nlohmann::json per_name = nlohmann::json::object();
  if (state.optimizer_shard) {
    for (const auto& [name, slots] : shardedStateIndex(state)) per_name[name] = slots;
  }
  for (const auto& [name, p] : state.optimizer.by_name) {
    std::vector<std::string> slots;
    if (p.step) slots.push_back("step");
    for (const auto& slot : p.slots) slots.push_back(slot.first);
    per_name[name] = slots;
  }
  j["optimizer"] = {{"name", state.optimizer_shard ? state.optimizer_shard->optimizer.name : state.optimizer.name},
                    {"state", per_name}};
  if (state.optimizer_shard) j["optimizer"]["shards"] = state.optimizer_shard->shards;
  return j;
}

std::string readFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(fmt::format("checkpoint {} '{}' cannot be read", what, path));
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

c10::Dict<std::string, at::Tensor> toDict(const NamedTensors& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  // A copy on the CPU holding only its own elements (not a view's whole storage).
  for (const auto& [name, t] : tensors) dict.insert(name, t.detach().to(at::kCPU).clone());
  return dict;
}

NamedTensors fromDict(const c10::IValue& value, const std::string& what) {
  if (!value.isGenericDict()) throw CheckpointError(fmt::format("{} is not a dict of tensors", what));
  NamedTensors out;
  for (const auto& kv : value.toGenericDict()) out.emplace_back(kv.key().toStringRef(), kv.value().toTensor());
  return out;
}

// The step of a folder named step_<digits>, or -1.
std::int64_t stepOfFolder(const std::string& name) {
  if (name.rfind("step_", 0) != 0 || name.size() <= 5) return -1;
  if (name.find_first_not_of("0123456789", 5) != std::string::npos) return -1;
  return std::stoll(name.substr(5));
}

void pruneCheckpoints(const fs::path& root, int keep) {
  if (keep <= 0) return;
  std::vector<std::pair<std::int64_t, fs::path>> steps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    std::int64_t step = stepOfFolder(entry.path().filename().string());
    if (step >= 0 && entry.is_directory()) steps.emplace_back(step, entry.path());
  }
  std::sort(steps.begin(), steps.end());
  for (std::size_t k = 0; k + keep < steps.size(); ++k) fs::remove_all(steps[k].second, ec);
}

// Note [Checkpoints for torch.load]: since torch 2.6, torch.load defaults to
// weights_only=True, which refuses the type tags torch::pickle_save writes
// for typed containers (torch.jit._pickle.restore_type_tag). Checkpoints are
// pickled without them: plain dicts of strings, ints and tensors, in the
// torch.save zip layout (data.pkl + data/<i>), which torch.load of any version
// reads by default, and torch::pickle_load too.
std::vector<char> pickleForTorchLoad(const c10::IValue& value) {
  std::vector<char> pickled;
  torch::jit::Pickler pickler([&](const char* bytes, size_t n) { pickled.insert(pickled.end(), bytes, bytes + n); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::vector<char> archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) -> size_t {
    const char* bytes = static_cast<const char*>(data);
    archive.insert(archive.end(), bytes, bytes + n);
    return n;
  });
  torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return archive;
}

}  // namespace

std::string checkpointDir(const std::string& root, std::int64_t step) {
  return (fs::path(root) / fmt::format("step_{:08d}", step)).string();
}

std::string partialCheckpointDir(const std::string& root, std::int64_t step) {
  return checkpointDir(root, step) + ".partial";
}

void clearCheckpointStep(const std::string& root, std::int64_t step) {
  std::error_code ec;
  fs::remove_all(partialCheckpointDir(root, step), ec);
  fs::remove_all(checkpointDir(root, step), ec);
}

namespace {

void writeOptimizerShard(const fs::path& dir, const StageCheckpoint& state) {
  const OptimizerShard& shard = *state.optimizer_shard;
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("format", std::string(kCheckpointFormat));
  dict.insert("stage", static_cast<std::int64_t>(state.stage));
  dict.insert("step", state.step);
  dict.insert("shard", static_cast<std::int64_t>(shard.shard));
  dict.insert("shards", static_cast<std::int64_t>(shard.shards));
  dict.insert("optimizer", optimizerToIValue(shard.optimizer));
  c10::impl::GenericDict ranges(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [name, r] : shard.ranges) {
    // A plain list (not an int list, which torch.load's weights_only refuses).
    c10::impl::GenericList triple(c10::AnyType::get());
    for (std::int64_t v : {r.begin, r.end, r.numel}) triple.push_back(v);
    ranges.insert(name, triple);
  }
  dict.insert("ranges", ranges);
  if (!shard.shapes.empty()) {
    dict.insert("parameters", toDict(shard.parameters));
    c10::impl::GenericDict shapes(c10::StringType::get(), c10::AnyType::get());
    for (const auto& [name, shape] : shard.shapes) {
      c10::impl::GenericList dims(c10::AnyType::get());
      for (std::int64_t v : shape) dims.push_back(v);
      shapes.insert(name, dims);
    }
    dict.insert("shapes", shapes);
  }
  std::vector<char> bytes = pickleForTorchLoad(dict);
  writeFileAtomically((dir / optimizerShardFile(state.stage, shard.shard)).string(),
                      std::string(bytes.begin(), bytes.end()));
}

}  // namespace

void writeStageCheckpoint(const std::string& root, const StageCheckpoint& state) {
  const fs::path dir = partialCheckpointDir(root, state.step);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    throw CheckpointError(fmt::format("cannot create checkpoint folder '{}': {}", dir.string(), ec.message()),
                          ErrorCode::kIo);
  }

  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("format", std::string(kCheckpointFormat));
  dict.insert("stage", static_cast<std::int64_t>(state.stage));
  dict.insert("step", state.step);
  dict.insert("data_position", state.data_position);
  dict.insert("parameters", toDict(state.parameters));
  dict.insert("buffers", toDict(state.buffers));
  dict.insert("rng_state", state.rng_state.defined() ? state.rng_state.clone() : at::empty({0}, at::kByte));
  // Optional: a CPU run writes none, and a checkpoint without it still loads.
  if (state.device_rng_state.defined()) dict.insert("device_rng_state", state.device_rng_state.to(at::kCPU).clone());
  if (state.optimizer_shard) {
    StageOptimizerState none;
    none.name = state.optimizer_shard->optimizer.name;
    dict.insert("optimizer", optimizerToIValue(none));
    dict.insert("optimizer_shards", static_cast<std::int64_t>(state.optimizer_shard->shards));
    if (shardsParameters(state)) dict.insert("parameter_shards", static_cast<std::int64_t>(state.optimizer_shard->shards));
    writeOptimizerShard(dir, state);
  } else {
    dict.insert("optimizer", optimizerToIValue(state.optimizer));
  }
  std::vector<char> bytes = pickleForTorchLoad(dict);
  writeFileAtomically((dir / stageFile(state.stage)).string(), std::string(bytes.begin(), bytes.end()));
  writeFileAtomically((dir / indexFile(state.stage)).string(), stageIndexJson(state).dump(1) + "\n");
}

std::string optimizerShardFile(int stage, int shard) { return fmt::format("stage_{}.optim_shard_{}.pt", stage, shard); }


std::string folderContentsToJson(const FolderContents& contents) {
  nlohmann::json j;
  j["host"] = contents.host;
  j["digests"] = contents.digests;
  j["indexes"] = contents.indexes;
  return j.dump();
}

FolderContents folderContentsFromJson(const std::string& text, const std::string& from) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    FolderContents out;
    out.host = j.at("host").get<std::string>();
    out.digests = j.at("digests").get<std::map<std::string, std::string>>();
    out.indexes = j.at("indexes").get<std::map<std::string, std::string>>();
    for (const auto& [name, digest] : out.digests) {
      if (!stage::isSha256(digest) || name.find('/') != std::string::npos) {
        throw CheckpointError(fmt::format("{}: the entry for '{}' is malformed", from, name));
      }
    }
    for (const auto& [name, text] : out.indexes) {
      if (name.find('/') != std::string::npos) throw CheckpointError(fmt::format("{}: '{}' is no index name", from, name));
    }
    return out;
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("{} is not a checkpoint folder's contents: {}", from, e.what()));
  }
}

FolderContents listPartialCheckpoint(const std::string& root, std::int64_t step, const std::string& host) {
  FolderContents out;
  out.host = host;
  const fs::path dir = partialCheckpointDir(root, step);
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    // Only the stage files and indexes (a writer's temporary is not one).
    if (name.rfind("stage_", 0) != 0 || !entry.is_regular_file(ec)) continue;
    const bool index = name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0;
    const bool file = name.size() > 3 && name.compare(name.size() - 3, 3, ".pt") == 0;
    if (!index && !file) continue;
    out.digests[name] = stage::sha256OfFile(entry.path().string());
    if (index) out.indexes[name] = readFile(entry.path().string(), "stage index");
  }
  if (ec) {
    throw CheckpointError(fmt::format("cannot list checkpoint folder '{}': {}", dir.string(), ec.message()),
                          ErrorCode::kIo);
  }
  return out;
}

void sealCheckpoint(const std::string& root, const CheckpointMeta& meta, const FolderContents& own,
                    const std::vector<FolderContents>& others) {
  const std::string partial = partialCheckpointDir(root, meta.step);
  const std::string final_dir = checkpointDir(root, meta.step);
  nlohmann::json j;
  j["format"] = kCheckpointFormat;
  j["step"] = meta.step;
  j["num_stages"] = meta.num_stages;
  j["source"] = meta.source;
  j["schedule"] = meta.schedule;
  j["world_size"] = meta.world_size;
  j["seed"] = meta.seed;
  j["tied"] = meta.tied;
  j["unused"] = meta.unused;
  if (meta.block_size) j["block_size"] = *meta.block_size;
  if (meta.layout) {
    j["layout"] = {{"pipeline_ranks", meta.layout->pipeline_ranks},
                   {"data_parallel", meta.layout->data_parallel},
                   {"stages_per_rank", meta.layout->stages_per_rank},
                   {"zero_stage", meta.layout->zero_stage}};
  }
  if (meta.loss_scale) {
    j["loss_scale"] = {{"scale", meta.loss_scale->scale}, {"growth_tracker", meta.loss_scale->growth_tracker}};
  }
  // Note [Sharded checkpoints]: one optimizer file per data-parallel rank.
  const int shards = meta.layout && meta.layout->zero_stage > 0 ? meta.layout->data_parallel : 0;
  j["stages"] = nlohmann::json::array();
  for (int s = 0; s < meta.num_stages; ++s) {
    nlohmann::json entry{{"index", s}, {"file", stageFile(s)}, {"index_file", indexFile(s)}};
    if (shards > 0) {
      std::vector<std::string> files;
      for (int k = 0; k < shards; ++k) files.push_back(optimizerShardFile(s, k));
      entry["optimizer_shards"] = files;
    }
    j["stages"].push_back(entry);
  }
  // Note [File digests]: this folder's files as written here; a file only
  // other folders hold, as written there (what a copy brings).
  std::map<std::string, std::string> digests = own.digests;
  std::map<std::string, std::set<std::string>> hosts;
  for (const auto& [name, digest] : own.digests) hosts[name].insert(own.host);
  std::map<std::string, std::string> missing_indexes;
  for (const FolderContents& other : others) {
    for (const auto& [name, digest] : other.digests) {
      digests.emplace(name, digest);
      hosts[name].insert(other.host);
    }
    for (const auto& [name, text] : other.indexes) {
      if (!own.indexes.count(name)) missing_indexes.emplace(name, text);
    }
  }
  for (int s = 0; s < meta.num_stages; ++s) {
    std::vector<std::string> names{stageFile(s), indexFile(s)};
    for (int k = 0; k < shards; ++k) names.push_back(optimizerShardFile(s, k));
    for (const std::string& name : names) {
      if (!digests.count(name)) {
        throw CheckpointError(fmt::format("checkpoint step {}: no rank wrote '{}' (stage {})", meta.step, name, s));
      }
    }
  }
  // Every folder holds every index, so that any host can check the model.
  for (const auto& [name, text] : missing_indexes) digests[name] = stage::sha256OfBytes(text);
  j["files"] = digests;
  // Where each file was written; only needed when some folder lacks one.
  bool everywhere = true;
  for (const auto& [name, digest] : digests) {
    if (!own.digests.count(name) && !missing_indexes.count(name)) everywhere = false;
  }
  if (!everywhere) {
    nlohmann::json where = nlohmann::json::object();
    for (const auto& [name, on] : hosts) where[name] = std::vector<std::string>(on.begin(), on.end());
    j["hosts"] = where;
  }
  // Several hosts sharing this folder may seal at once: whoever renames
  // first wins, and the others find the final folder in place. A host that
  // loses the race midway (the folder renamed while it wrote meta.json)
  // finds the winner's complete folder, which the checks below confirm;
  // anything else is a real failure.
  std::error_code ec;
  if (fs::exists(partial, ec)) {
    try {
      for (const auto& [name, text] : missing_indexes) writeFileAtomically((fs::path(partial) / name).string(), text);
      writeFileAtomically((fs::path(partial) / "meta.json").string(), j.dump(2) + "\n");
      if (::rename(partial.c_str(), final_dir.c_str()) != 0 && !fs::exists(final_dir, ec)) {
        throw CheckpointError(fmt::format("cannot rename '{}' to '{}': {}", partial, final_dir, std::strerror(errno)),
                              ErrorCode::kIo);
      }
    } catch (const std::exception&) {
      if (fs::exists(partial, ec) || !fs::exists(fs::path(final_dir) / "meta.json", ec)) throw;
    }
  }
  if (!fs::exists(fs::path(final_dir) / "meta.json", ec)) {
    throw CheckpointError(fmt::format("checkpoint step {}: '{}' was never written", meta.step, final_dir));
  }
}

void pointLatest(const std::string& root, std::int64_t step, int keep) {
  writeFileAtomically((fs::path(root) / "latest").string(), fs::path(checkpointDir(root, step)).filename().string() + "\n");
  pruneCheckpoints(root, keep);
}

void commitCheckpoint(const std::string& root, const CheckpointMeta& meta, int keep) {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) std::snprintf(name, sizeof(name), "?");
  sealCheckpoint(root, meta, listPartialCheckpoint(root, meta.step, name), {});
  pointLatest(root, meta.step, keep);
}

std::optional<std::string> latestCheckpoint(const std::string& root) {
  const fs::path pointer = fs::path(root) / "latest";
  std::error_code ec;
  if (!fs::exists(pointer, ec)) return std::nullopt;
  std::string name = readFile(pointer.string(), "pointer");
  while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
  const fs::path dir = fs::path(root) / name;
  if (stepOfFolder(name) < 0 || !fs::exists(dir / "meta.json", ec)) {
    throw CheckpointError(fmt::format("'{}' names '{}', which is not a complete checkpoint folder; remove the "
                                      "pointer or point it at a step_<N> folder",
                                      pointer.string(), name));
  }
  return dir.string();
}

namespace {

// The hosts meta.json says hold `file`, when not every folder holds it.
std::vector<std::string> hostsHolding(const nlohmann::json& meta, const std::string& file) {
  if (!meta.contains("hosts") || !meta["hosts"].is_object() || !meta["hosts"].contains(file)) return {};
  std::vector<std::string> out;
  for (const auto& h : meta["hosts"][file]) {
    if (h.is_string()) out.push_back(h.get<std::string>());
  }
  return out;
}

// A file of `step_dir` a reader needs: refused, naming the host that holds
// it and the fix, when it is another host's (Note [Checkpoints on each
// host's own disk]).
void requireHere(const std::string& step_dir, const std::string& file) {
  std::error_code ec;
  if (fs::exists(fs::path(step_dir) / file, ec)) return;
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(readFile((fs::path(step_dir) / "meta.json").string(), "meta"));
  } catch (const std::exception&) {
    return;  // the reader names the missing file
  }
  const std::vector<std::string> hosts = hostsHolding(meta, file);
  if (hosts.empty()) return;
  // "node2, 10.0.0.2" -> "node2"
  const std::string host = hosts[0].substr(0, hosts[0].find(','));
  const std::string dir = fs::path(step_dir).lexically_normal().string();
  throw CheckpointError(fmt::format(
      "checkpoint '{}' has no {} on this host: it was written on host {} (checkpoint.dir is not shared across "
      "hosts), and this run's ranks on this host need it. Copy that host's step folder into this one, e.g. `rsync "
      "-a --ignore-existing {}:{}/ {}/` (meta.json's digests check the copied files), or resume on the hosts and "
      "ranks that wrote it (README \"Checkpoints on each host's own disk\")",
      dir, file, hosts[0], host, dir, dir));
}

}  // namespace

void verifyCheckpoint(const std::string& step_dir) {
  const std::string meta_path = (fs::path(step_dir) / "meta.json").string();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(readFile(meta_path, "checkpoint meta"));
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("'{}' is malformed: {}", meta_path, e.what()));
  }
  if (!j.contains("files")) return;  // written before digests
  if (!j["files"].is_object()) throw CheckpointError(fmt::format("'{}': \"files\" is not an object", meta_path));
  for (const auto& [name, digest] : j["files"].items()) {
    if (!digest.is_string() || !stage::isSha256(digest.get<std::string>()) || name.find('/') != std::string::npos) {
      throw CheckpointError(fmt::format("'{}': the digest entry for '{}' is malformed", meta_path, name));
    }
    // Note [Checkpoints on each host's own disk]: another host's file.
    std::error_code ec;
    if (!fs::exists(fs::path(step_dir) / name, ec) && !hostsHolding(j, name).empty()) continue;
    try {
      stage::verifyFileDigest((fs::path(step_dir) / name).string(), digest.get<std::string>(), "checkpoint file",
                              "resume from another checkpoint (CKPT/step_<N>) or restore the file");
    } catch (const stage::DigestError& e) {
      throw CheckpointError(e.what());
    }
  }
}

std::optional<std::string> newestIntactCheckpoint(const std::string& root, std::string* warning) {
  std::optional<std::string> latest = latestCheckpoint(root);
  if (!latest) return std::nullopt;
  std::vector<std::pair<std::int64_t, fs::path>> older;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::int64_t step = stepOfFolder(entry.path().filename().string());
    if (step >= 0 && entry.path() != fs::path(*latest) && fs::exists(entry.path() / "meta.json", ec)) {
      older.emplace_back(step, entry.path());
    }
  }
  std::sort(older.rbegin(), older.rend());
  std::string problems;
  std::vector<std::string> candidates{*latest};
  for (const auto& [step, dir] : older) {
    if (step < stepOfFolder(fs::path(*latest).filename().string())) candidates.push_back(dir.string());
  }
  for (const std::string& dir : candidates) {
    try {
      verifyCheckpoint(dir);
      // Note [Checkpoint commit]: a newer step a lost rank never finished.
      std::vector<std::string> unfinished;
      const std::int64_t chosen = stepOfFolder(fs::path(dir).filename().string());
      for (const auto& entry : fs::directory_iterator(root, ec)) {
        const std::string name = entry.path().filename().string();
        const std::string suffix = ".partial";
        if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
          continue;
        }
        if (stepOfFolder(name.substr(0, name.size() - suffix.size())) > chosen) unfinished.push_back(name);
      }
      std::sort(unfinished.begin(), unfinished.end());
      if (!unfinished.empty()) {
        problems += fmt::format("{}{} was never completed (a rank or host was lost while writing it)",
                                problems.empty() ? "" : "; ", fmt::join(unfinished, ", "));
      }
      if (!problems.empty() && warning != nullptr) {
        *warning = fmt::format("{}; resuming from '{}' instead", problems, dir);
      }
      return dir;
    } catch (const CheckpointError& e) {
      problems += (problems.empty() ? "" : "; ") + std::string(e.what());
    }
  }
  throw CheckpointError(fmt::format("no intact checkpoint under '{}': {}; set checkpoint.resume: false to start over",
                                    root, problems));
}

std::string resolveCheckpoint(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw CheckpointError(fmt::format("checkpoint '{}' does not exist", path));
  if (fs::exists(fs::path(path) / "meta.json", ec)) return path;
  if (auto latest = latestCheckpoint(path)) return *latest;
  throw CheckpointError(fmt::format("'{}' is neither a checkpoint folder (step_<N>/ with meta.json) nor a checkpoint "
                                    "root with a `latest` pointer",
                                    path));
}

CheckpointMeta readCheckpointMeta(const std::string& step_dir) {
  const std::string path = (fs::path(step_dir) / "meta.json").string();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(readFile(path, "metadata"));
    const std::string format = j.at("format").get<std::string>();
    if (format != kCheckpointFormat && format != kCheckpointFormatV1) {
      throw CheckpointError(fmt::format("'{}' has format '{}'; this Pipeforge reads {} and {}", path, format,
                                        kCheckpointFormat, kCheckpointFormatV1));
    }
    CheckpointMeta meta;
    meta.format_version = format == kCheckpointFormat ? 2 : 1;
    meta.step = j.at("step").get<std::int64_t>();
    meta.num_stages = j.at("num_stages").get<int>();
    meta.source = j.at("source").get<std::string>();
    meta.schedule = j.at("schedule").get<std::string>();
    meta.world_size = j.at("world_size").get<int>();
    meta.seed = j.at("seed").get<std::uint64_t>();
    meta.tied = j.at("tied").get<std::vector<std::vector<std::string>>>();
    meta.unused = j.value("unused", std::vector<std::string>{});
    if (j.contains("block_size")) {
      meta.block_size = j.at("block_size").get<std::int64_t>();
      if (*meta.block_size < 1) throw CheckpointError(fmt::format("'{}': block_size {} is not >= 1", path, *meta.block_size));
    }
    if (j.contains("layout")) {
      const auto& l = j.at("layout");
      CheckpointLayout layout{l.at("pipeline_ranks").get<int>(), l.at("data_parallel").get<int>(),
                              l.at("stages_per_rank").get<int>(), l.value("zero_stage", 0)};
      if (layout.pipeline_ranks < 1 || layout.data_parallel < 1 || layout.stages_per_rank < 1 ||
          layout.zero_stage < 0 || layout.zero_stage > 3) {
        throw CheckpointError(fmt::format("'{}': layout {} is out of range", path, l.dump()));
      }
      meta.layout = layout;
    }
    if (j.contains("loss_scale")) {
      const auto& ls = j.at("loss_scale");
      LossScaleState state{ls.at("scale").get<double>(), ls.at("growth_tracker").get<std::int64_t>()};
      if (!(state.scale > 0.0) || !std::isfinite(state.scale) || state.growth_tracker < 0) {
        throw CheckpointError(fmt::format("'{}': loss_scale {{scale {}, growth_tracker {}}} is out of range", path,
                                          state.scale, state.growth_tracker));
      }
      meta.loss_scale = state;
    }
    return meta;
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("'{}' is malformed: {}", path, e.what()));
  }
}

namespace {

// A pickled file of a step folder (`what`: "stage file"), read where this
// host may read it (Note [Checkpoints on each host's own disk]).
c10::IValue loadPickled(const std::string& step_dir, const std::string& file, const char* what, std::string& path) {
  requireHere(step_dir, file);
  path = (fs::path(step_dir) / file).string();
  const std::string bytes = readFile(path, what);
  try {
    return torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const c10::Error& e) {
    throw CheckpointError(fmt::format("checkpoint {} '{}' is corrupt: {}", what, path, e.what_without_backtrace()));
  }
}

}  // namespace

namespace {

// Note [Sharded checkpoints]: a zero-3 stage's parameters, whole, from the
// pieces its `shards` shard files hold; every element must be there.
NamedTensors assembleParameters(const std::string& step_dir, int stage, int shards) {
  std::map<std::string, at::Tensor> whole;
  std::map<std::string, std::int64_t> filled;
  for (int k = 0; k < shards; ++k) {
    const OptimizerShard shard = readOptimizerShard(step_dir, stage, k);
    const std::string file = (fs::path(step_dir) / optimizerShardFile(stage, k)).string();
    if (shard.shards != shards || shard.shapes.empty()) {
      throw CheckpointError(fmt::format("'{}' does not hold stage {}'s parameters in {} shards, as its stage file "
                                        "says; the checkpoint mixes files of two runs",
                                        file, stage, shards));
    }
    for (const auto& [name, piece] : shard.parameters) {
      const OptimizerShard::Range& r = shard.ranges.at(name);
      auto it = whole.find(name);
      if (it == whole.end()) it = whole.emplace(name, at::empty(shard.shapes.at(name), piece.options())).first;
      it->second.view({-1}).narrow(0, r.begin, r.end - r.begin).copy_(piece);
      filled[name] += r.end - r.begin;
    }
  }
  NamedTensors out;
  for (auto& [name, t] : whole) {
    if (filled[name] != t.numel()) {
      throw CheckpointError(fmt::format("checkpoint '{}' holds {} of the {} elements of stage {}'s '{}' in its {} "
                                        "parameter shards; the shard files are not one run's",
                                        step_dir, filled[name], t.numel(), stage, name, shards));
    }
    out.emplace_back(name, t);
  }
  return out;
}

}  // namespace

StageCheckpoint readStageCheckpoint(const std::string& step_dir, int stage) {
  std::string path;
  const c10::IValue value = loadPickled(step_dir, stageFile(stage), "stage file", path);
  if (!value.isGenericDict()) throw CheckpointError(fmt::format("'{}' is not a checkpoint stage file", path));
  auto dict = value.toGenericDict();
  for (const char* key : {"format", "stage", "step", "data_position", "parameters", "buffers", "rng_state"}) {
    if (!dict.contains(key)) throw CheckpointError(fmt::format("'{}' lacks '{}'; not a checkpoint stage file", path, key));
  }
  StageCheckpoint state;
  state.stage = static_cast<int>(dict.at("stage").toInt());
  state.step = dict.at("step").toInt();
  state.data_position = dict.at("data_position").toInt();
  state.parameters = fromDict(dict.at("parameters"), path + " parameters");
  state.buffers = fromDict(dict.at("buffers"), path + " buffers");
  state.rng_state = dict.at("rng_state").toTensor();
  if (dict.contains("device_rng_state")) state.device_rng_state = dict.at("device_rng_state").toTensor();
  if (dict.contains("optimizer")) state.optimizer = optimizerFromIValue(dict.at("optimizer"), path);
  if (dict.contains("optimizer_shards")) {
    state.optimizer_shards = static_cast<int>(dict.at("optimizer_shards").toInt());
    if (state.optimizer_shards < 1) {
      throw CheckpointError(fmt::format("'{}': optimizer_shards {} is not >= 1", path, state.optimizer_shards));
    }
  }
  if (state.stage != stage) {
    throw CheckpointError(fmt::format("'{}' holds stage {}, expected {}", path, state.stage, stage));
  }
  if (dict.contains("parameter_shards")) {
    state.parameter_shards = static_cast<int>(dict.at("parameter_shards").toInt());
    if (state.parameter_shards < 1) {
      throw CheckpointError(fmt::format("'{}': parameter_shards {} is not >= 1", path, state.parameter_shards));
    }
    state.parameters = assembleParameters(step_dir, stage, state.parameter_shards);
  }
  return state;
}

OptimizerShard readOptimizerShard(const std::string& step_dir, int stage, int shard) {
  std::string path;
  const c10::IValue value = loadPickled(step_dir, optimizerShardFile(stage, shard), "optimizer shard", path);
  auto bad = [&](const std::string& what) {
    return CheckpointError(fmt::format("'{}' is not an optimizer shard of stage {} ({})", path, stage, what));
  };
  if (!value.isGenericDict()) throw bad("not a dict");
  auto dict = value.toGenericDict();
  for (const char* key : {"stage", "shard", "shards", "optimizer", "ranges"}) {
    if (!dict.contains(key)) throw bad(fmt::format("no '{}'", key));
  }
  if (dict.at("stage").toInt() != stage || dict.at("shard").toInt() != shard) throw bad("another stage or shard");
  OptimizerShard out;
  out.shard = shard;
  out.shards = static_cast<int>(dict.at("shards").toInt());
  out.optimizer = optimizerFromIValue(dict.at("optimizer"), path);
  if (!dict.at("ranges").isGenericDict()) throw bad("ranges is not a dict");
  for (const auto& kv : dict.at("ranges").toGenericDict()) {
    std::vector<std::int64_t> list;
    if (kv.value().isList()) {
      for (const c10::IValue& v : kv.value().toListRef()) {
        if (!v.isInt()) throw bad(fmt::format("range of '{}'", kv.key().toStringRef()));
        list.push_back(v.toInt());
      }
    }
    if (list.size() != 3 || list[0] < 0 || list[0] > list[1] || list[1] > list[2]) {
      throw bad(fmt::format("range of '{}'", kv.key().toStringRef()));
    }
    out.ranges.emplace(kv.key().toStringRef(), OptimizerShard::Range{list[0], list[1], list[2]});
  }
  if (dict.contains("shapes")) {
    if (!dict.contains("parameters") || !dict.at("shapes").isGenericDict()) throw bad("shapes without parameters");
    out.parameters = fromDict(dict.at("parameters"), path + " parameters");
    for (const auto& kv : dict.at("shapes").toGenericDict()) {
      std::vector<std::int64_t> dims;
      if (kv.value().isList()) {
        for (const c10::IValue& v : kv.value().toListRef()) {
          if (!v.isInt() || v.toInt() < 0) throw bad(fmt::format("shape of '{}'", kv.key().toStringRef()));
          dims.push_back(v.toInt());
        }
      }
      out.shapes.emplace(kv.key().toStringRef(), dims);
    }
    for (const auto& [name, piece] : out.parameters) {
      auto range = out.ranges.find(name);
      auto shape = out.shapes.find(name);
      if (range == out.ranges.end() || shape == out.shapes.end()) {
        throw bad(fmt::format("no range or shape for parameter '{}'", name));
      }
      std::int64_t numel = 1;
      for (std::int64_t v : shape->second) numel *= v;
      if (numel != range->second.numel || piece.dim() != 1 || piece.numel() != range->second.end - range->second.begin) {
        throw bad(fmt::format("parameter '{}' is not the 1-D piece its range and shape say", name));
      }
    }
  }
  for (const auto& [name, p] : out.optimizer.by_name) {
    auto it = out.ranges.find(name);
    if (it == out.ranges.end()) throw bad(fmt::format("no range for '{}'", name));
    for (const auto& [slot, t] : p.slots) {
      if (t.dim() != 1 || t.numel() != it->second.end - it->second.begin) {
        throw bad(fmt::format("'{}' of '{}' is not the 1-D piece its range says", slot, name));
      }
    }
  }
  return out;
}

StageIndex readStageIndex(const std::string& step_dir, int stage) {
  const std::string path = (fs::path(step_dir) / indexFile(stage)).string();
  try {
    const nlohmann::json j = nlohmann::json::parse(readFile(path, "stage index"));
    StageIndex index;
    index.stage = j.at("stage").get<int>();
    index.step = j.at("step").get<std::int64_t>();
    index.parameters = j.at("parameters").get<std::map<std::string, std::string>>();
    index.buffers = j.at("buffers").get<std::map<std::string, std::string>>();
    index.optimizer = j.at("optimizer").at("name").get<std::string>();
    index.optimizer_state = j.at("optimizer").at("state").get<std::map<std::string, std::vector<std::string>>>();
    index.optimizer_shards = j.at("optimizer").value("shards", 0);
    index.parameter_shards = j.value("parameter_shards", 0);
    if (index.stage != stage) {
      throw CheckpointError(fmt::format("'{}' describes stage {}, expected {}", path, index.stage, stage));
    }
    return index;
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("'{}' is malformed: {}", path, e.what()));
  }
}

void loadOptimizerState(const std::string& step_dir, int stage, torch::optim::Optimizer& optimizer) {
  const std::string path = (fs::path(step_dir) / optimizerFile(stage)).string();
  std::istringstream in(readFile(path, "optimizer file"));
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(in);
    optimizer.load(archive);
  } catch (const c10::Error& e) {
    throw CheckpointError(fmt::format("optimizer state '{}' does not fit this optimizer (another optimizer.name, or "
                                      "another split?): {}",
                                      path, e.what_without_backtrace()));
  }
}

}  // namespace pipeforge::train
