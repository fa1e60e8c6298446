#include "stage/pt2_stage_writer.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <cstdint>
#include <cctype>
#include <map>
#include <set>

#include "common/error.h"
#include "common/torch_zip.h"
#include "frontend/module_paths.h"
#include "frontend/pt2_archive.h"
#include "stage/build_stages.h"
#include "stage/pt2_stage_plan.h"

namespace pipeforge::stage {
namespace {

using json = nlohmann::ordered_json;

// The model name inside a stage archive: torch.export.load reads "model".
constexpr const char* kStageModel = "model";

// Pytree treespecs (TREESPEC_VERSION 1) as torch.export.save writes them for
// forward(*tensors) -> tuple(tensors): a leaf per tensor.
std::string leaves(size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += (i ? ", " : "") + std::string(R"({"type": null, "context": null, "children_spec": []})");
  }
  return out;
}

std::string inSpec(size_t num_inputs) {
  return R"([1, {"type": "builtins.tuple", "context": "null", "children_spec": [{"type": "builtins.tuple", )"
         R"("context": "null", "children_spec": [)" +
         leaves(num_inputs) +
         R"(]}, {"type": "builtins.dict", "context": "[]", "children_spec": []}]}])";
}

std::string outSpec(size_t num_outputs) {
  return R"([1, {"type": "builtins.tuple", "context": "null", "children_spec": [)" + leaves(num_outputs) + "]}]";
}

// Renames value references in an argument tree (subgraphs are not entered:
// their names are their own).
void renameValues(json& j, const std::map<std::string, std::string>& renames) {
  if (j.is_array()) {
    for (auto& e : j) renameValues(e, renames);
    return;
  }
  if (!j.is_object()) return;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "as_graph") continue;
    if (it.key() == "name" && it.value().is_string()) {
      auto renamed = renames.find(it.value().get<std::string>());
      if (renamed != renames.end()) it.value() = renamed->second;
      continue;
    }
    renameValues(it.value(), renames);
  }
}

// Whether `text` mentions symbol `name` ("s95" in "Symbol('s95', ...)"), as a whole word.
bool mentions(const std::string& text, const std::string& name) {
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t at = text.find(name); at != std::string::npos; at = text.find(name, at + 1)) {
    bool left = at == 0 || !word(text[at - 1]);
    bool right = at + name.size() == text.size() || !word(text[at + name.size()]);
    if (left && right) return true;
  }
  return false;
}

// The source archive mapped read-only, with its records' places and CRC-32s
// from its central directory, so that a stage's records are copied from it
// without reading them into memory (Note [Stage files at the disk's speed]).
class SourceArchive {
 public:
  explicit SourceArchive(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd_ < 0 || ::fstat(fd_, &st) != 0 || st.st_size <= 0) return;  // read through LibTorch instead
    const auto size = static_cast<std::size_t>(st.st_size);
    void* base = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd_, 0);
    if (base == MAP_FAILED) return;
    base_ = base;
    size_ = size;
    for (ZipRecord& r : readZipDirectory(base, size, path)) {
      const auto slash = r.name.find('/');
      if (slash != std::string::npos) records_.emplace(r.name.substr(slash + 1), std::move(r));
    }
  }
  ~SourceArchive() {
    if (base_ != nullptr) ::munmap(base_, size_);
    if (fd_ >= 0) ::close(fd_);
  }
  SourceArchive(const SourceArchive&) = delete;
  SourceArchive& operator=(const SourceArchive&) = delete;

  // The stored record `name` (relative to the archive's root), or null.
  const ZipRecord* stored(const std::string& name) const {
    auto it = records_.find(name);
    return it == records_.end() || it->second.method != 0 ? nullptr : &it->second;
  }
  int fd() const { return fd_; }
  // The record's bytes in a read-only mapping of the archive.
  const void* bytes(const ZipRecord& r) const { return static_cast<const char*>(base_) + r.data_offset; }

 private:
  int fd_ = -1;
  void* base_ = nullptr;
  std::size_t size_ = 0;
  std::map<std::string, ZipRecord> records_;
};

// The archive root torch.export.load expects: the file's stem.
std::string archiveRoot(const std::string& path) {
  std::string stem = path.substr(path.find_last_of('/') + 1);
  const auto dot = stem.find_last_of('.');
  return dot == std::string::npos ? stem : stem.substr(0, dot);
}

class StageWriter {
 public:
  StageWriter(const frontend::Pt2Archive& archive, const Pt2StagePlan& stage)
      : archive_(archive), stage_(stage), reader_(archive.path()), source_(archive.path()) {}

  std::string write(const std::string& path) {
    json program = programJson();
    json weights = json{{"config", json::object()}};
    json constants = json{{"config", json::object()}};
    std::vector<std::string> weight_files;
    std::vector<std::string> constant_files;
    const json original_weights = readConfig("data/weights/" + archive_.modelName() + "_weights_config.json");
    const json original_constants = readConfig("data/constants/" + archive_.modelName() + "_constants_config.json");
    std::map<std::string, const frontend::Pt2TensorEntry*> entries;
    for (const auto& e : archive_.tensors()) entries.emplace(e.fqn, &e);
    // Tensors filled from --weights (Note [Weights by FQN]): one new record
    // per tensor, shared by the names of one tie.
    std::vector<std::pair<std::string, const frontend::Pt2TensorEntry*>> filled_weights, filled_constants;
    std::map<const void*, std::string> filled_names;
    for (int l : stage_.lifted) {
      const std::string& fqn = archive_.signature().inputs[l].target;
      auto e = entries.find(fqn);
      if (e != entries.end() && !e->second->weights_source.empty()) {
        const bool constant = e->second->is_constant;
        const json& from = constant ? original_constants : original_weights;
        const at::Tensor& value = archive_.stored(fqn);  // converted as it is written
        auto [named, fresh] = filled_names.emplace(
            value.unsafeGetTensorImpl(), fmt::format("{}_pf{}", constant ? "tensor" : "weight", filled_names.size()));
        if (fresh) (constant ? filled_constants : filled_weights).emplace_back(named->second, e->second);
        (constant ? constants : weights)["config"][fqn] = filledEntry(from, fqn, named->second, value);
        continue;
      }
      if (!copyEntry(original_weights, fqn, weights, weight_files) &&
          !copyEntry(original_constants, fqn, constants, constant_files)) {
        throw StageBuildError(fmt::format("'{}': no weight or constant payload for '{}'", archive_.path(), fqn));
      }
    }

    TorchZipWriter writer(path, archiveRoot(path));
    for (const auto& file : weight_files) copyRecord(writer, "data/weights/" + file);
    for (const auto& [name, entry] : filled_weights) writeTensor(writer, "data/weights/" + name, *entry);
    writeText(writer, std::string("data/weights/") + kStageModel + "_weights_config.json", weights.dump());
    for (const auto& file : constant_files) copyRecord(writer, "data/constants/" + file);
    for (const auto& [name, entry] : filled_constants) writeTensor(writer, "data/constants/" + name, *entry);
    writeText(writer, std::string("data/constants/") + kStageModel + "_constants_config.json", constants.dump());
    writeText(writer, std::string("models/") + kStageModel + ".json", program.dump());
    // No example inputs: torch.export.load reads an empty record as None.
    writeText(writer, std::string("data/sample_inputs/") + kStageModel + ".pt", "");
    copyRecord(writer, "archive_format");
    copyRecord(writer, "archive_version");
    return writer.finish(/*version=*/6);  // what torch's PT2ArchiveWriter sets
  }

 private:
  json readConfig(const std::string& record) {
    if (!reader_.hasRecord(record)) return json{{"config", json::object()}};
    auto [data, size] = reader_.getRecord(record);
    return json::parse(std::string(static_cast<const char*>(data.get()), size));
  }

  bool copyEntry(const json& from, const std::string& fqn, json& to, std::vector<std::string>& files) {
    const json& config = from.at("config");
    if (!config.contains(fqn)) return false;
    const json& entry = config.at(fqn);
    to["config"][fqn] = entry;
    std::string file = entry.at("path_name").get<std::string>();
    if (std::find(files.begin(), files.end(), file) == files.end()) files.push_back(file);
    return true;
  }

  // The archive's payload entry of `fqn`, for a tensor of its own record:
  // a dense CPU tensor of the declared dtype and sizes.
  static json filledEntry(const json& from, const std::string& fqn, const std::string& record,
                          const at::Tensor& value) {
    json entry = from.at("config").at(fqn);
    entry["path_name"] = record;
    json& meta = entry["tensor_meta"];
    meta["device"] = {{"type", "cpu"}, {"index", nullptr}};
    json strides = json::array();
    std::int64_t stride = 1;  // written contiguous
    std::vector<std::int64_t> dense(value.dim());
    for (std::int64_t d = value.dim() - 1; d >= 0; --d) {
      dense[d] = stride;
      stride *= std::max<std::int64_t>(value.size(d), 1);
    }
    for (std::int64_t s : dense) strides.push_back({{"as_int", s}});
    meta["strides"] = strides;
    meta["storage_offset"] = {{"as_int", 0}};
    return entry;
  }

  // One filled tensor's bytes as a record (Note [Weights by FQN]). A value
  // that is a view of its safetensors source's mapping has its pages dropped
  // once written: a split then holds one chunk of them at a time, not every
  // page it wrote (they count in its RSS otherwise; they stay in the page
  // cache). One the source holds in another dtype is converted as it is
  // written, a chunk at a time, never whole.
  void writeTensor(TorchZipWriter& writer, const std::string& name, const frontend::Pt2TensorEntry& entry) {
    const at::Tensor held = archive_.stored(entry.fqn).detach();
    if (entry.convert_to >= 0 && held.is_contiguous()) {
      const auto type = static_cast<at::ScalarType>(entry.convert_to);
      const std::size_t out_size = c10::elementSize(type);
      const at::Tensor flat = held.reshape({-1});
      const bool view = entry.source_view;
      writer.add(name, held.numel() * out_size, [&](std::size_t offset, std::size_t n, void* out) {
        const auto first = static_cast<std::int64_t>(offset / out_size), count = static_cast<std::int64_t>(n / out_size);
        const at::Tensor from = flat.narrow(0, first, count);
        at::from_blob(out, {count}, at::TensorOptions().dtype(type)).copy_(from);
        if (view) dropMappedPages(from.data_ptr(), from.nbytes());
      });
      return;
    }
    if (entry.source_view && entry.convert_to < 0 && !entry.source_file.empty()) {
      writer.addFromFile(name, sourceFile(entry.source_file), entry.source_offset, held.nbytes(), std::nullopt,
                         held.data_ptr());
      return;
    }
    const at::Tensor value =
        entry.convert_to >= 0 ? held.to(static_cast<at::ScalarType>(entry.convert_to)).contiguous() : held.contiguous();
    const bool view = entry.source_view && entry.convert_to < 0 && value.data_ptr() == held.data_ptr();
    writer.add(name, value.data_ptr(), value.numel() * value.element_size(), std::nullopt,
               view ? TorchZipWriter::Pages::kDropMapped : TorchZipWriter::Pages::kKeep);
  }

  void copyRecord(TorchZipWriter& writer, const std::string& name) {
    if (const ZipRecord* r = source_.stored(name)) {
      writer.addFromFile(name, source_.fd(), r->data_offset, r->size, r->crc32, source_.bytes(*r));
      return;
    }
    auto [data, size] = reader_.getRecord(name);
    writer.add(name, data.get(), size);
  }

  static void writeText(TorchZipWriter& writer, const std::string& name, const std::string& text) {
    writer.add(name, text);
  }

  // The stage's program: the original one with this stage's signature, nodes
  // and value metadata, and only the module calls and symbols it uses.
  json programJson() {
    json program = archive_.programJson();
    json& gm = program.at("graph_module");
    json& graph = gm.at("graph");
    std::set<std::string> names;    // every value the stage names
    std::set<std::string> modules;  // the modules its nodes run in
    StageSignature signature = stageSignature(gm.at("signature").at("input_specs"), names);
    json nodes = stageNodes(names, modules);
    graph["inputs"] = std::move(signature.inputs);
    graph["outputs"] = std::move(signature.outputs);
    graph["nodes"] = std::move(nodes);
    const std::string kept = keepValueMetadata(graph, names);
    if (graph.contains("is_single_tensor_return")) graph["is_single_tensor_return"] = false;
    gm.at("signature")["input_specs"] = std::move(signature.input_specs);
    gm.at("signature")["output_specs"] = std::move(signature.output_specs);
    json calls = moduleCallGraph(gm, modules);
    gm["module_call_graph"] = std::move(calls);
    keepRangeConstraints(program, kept);
    // Guards name the original forward's inputs; a stage has its own.
    if (program.contains("guards_code")) program["guards_code"] = json::array();
    return program;
  }

  struct StageSignature {
    json inputs = json::array();
    json input_specs = json::array();
    json outputs = json::array();
    json output_specs = json::array();
  };

  // Inputs: the lifted parameters and buffers it uses, then its own inputs.
  // Outputs: the buffers it changes, then what it sends on. Adds each value to `names`.
  StageSignature stageSignature(const json& specs, std::set<std::string>& names) const {
    const json& original = archive_.graphJson();
    StageSignature signature;
    for (int l : stage_.lifted) {
      signature.inputs.push_back(original.at("inputs").at(l));
      signature.input_specs.push_back(specs.at(l));
      names.insert(archive_.signature().inputs[l].value);
    }
    for (const auto& name : stage_.inputs) {
      json arg = {{"as_tensor", {{"name", name}}}};
      signature.inputs.push_back(arg);
      signature.input_specs.push_back({{"user_input", {{"arg", arg}}}});
      names.insert(name);
    }
    for (const auto& [value, buffer] : stage_.mutations) {
      signature.outputs.push_back({{"as_tensor", {{"name", value}}}});
      signature.output_specs.push_back({{"buffer_mutation", {{"arg", {{"name", value}}}, {"buffer_name", buffer}}}});
      names.insert(value);
    }
    for (const auto& value : stage_.outputs) {
      json arg = {{"as_tensor", {{"name", value}}}};
      signature.outputs.push_back(arg);
      signature.output_specs.push_back({{"user_output", {{"arg", arg}}}});
      names.insert(value);
    }
    return signature;
  }

  // The stage's nodes, renamed as planned; adds the values they use and
  // define to `names` and the modules they run in to `modules`.
  json stageNodes(std::set<std::string>& names, std::set<std::string>& modules) const {
    const json& original = archive_.graphJson();
    json nodes = json::array();
    for (int i : stage_.nodes) {
      json node = original.at("nodes").at(i);
      auto renames = stage_.renames.find(i);
      if (renames != stage_.renames.end()) {
        for (auto& in : node.at("inputs")) renameValues(in.at("arg"), renames->second);
      }
      for (const auto& u : frontend::pt2NodeUses(node)) names.insert(u);
      for (const auto& d : frontend::pt2NodeDefs(node)) names.insert(d);
      for (const auto& frame : archive_.nodes()[i].module_stack) modules.insert(frame.path);
      nodes.push_back(std::move(node));
    }
    return nodes;
  }

  // Drops the metadata of values the stage does not name; returns the kept
  // metadata as text, searched for symbols.
  static std::string keepValueMetadata(json& graph, const std::set<std::string>& names) {
    std::string kept;
    for (const char* table : {"tensor_values", "sym_int_values", "sym_bool_values", "sym_float_values",
                              "custom_obj_values"}) {
      if (!graph.contains(table)) continue;
      json filtered = json::object();
      for (const auto& [name, value] : graph.at(table).items()) {
        if (!names.count(name)) continue;
        filtered[name] = value;
        kept += value.dump();
      }
      graph[table] = std::move(filtered);
    }
    return kept;
  }

  // The root call's signature: forward(*inputs) -> tuple; other entries
  // for the modules the stage runs in or holds state of.
  json moduleCallGraph(const json& gm, const std::set<std::string>& modules) const {
    std::vector<std::string> held;
    for (int l : stage_.lifted) held.push_back(archive_.signature().inputs[l].target);
    json calls = json::array();
    for (const auto& entry : gm.value("module_call_graph", json::array())) {
      std::string fqn = entry.value("fqn", "");
      if (fqn.empty()) {
        json root = entry;
        if (!root.contains("signature") || !root.at("signature").is_object()) {
          root["signature"] = {{"inputs", json::array()}, {"outputs", json::array()}};
        }
        root["signature"]["in_spec"] = inSpec(stage_.inputs.size());
        root["signature"]["out_spec"] = outSpec(stage_.outputs.size());
        root["signature"]["forward_arg_names"] = stage_.inputs;
        calls.push_back(std::move(root));
        continue;
      }
      bool used = modules.count(fqn) > 0 ||
                  std::any_of(held.begin(), held.end(), [&](const std::string& h) { return frontend::isWithin(h, fqn); });
      if (used) calls.push_back(entry);
    }
    return calls;
  }

  // Keeps the range constraints of the symbols the kept metadata mentions.
  static void keepRangeConstraints(json& program, const std::string& kept) {
    if (!program.contains("range_constraints") || !program.at("range_constraints").is_object()) return;
    json ranges = json::object();
    for (const auto& [symbol, range] : program.at("range_constraints").items()) {
      if (mentions(kept, symbol)) ranges[symbol] = range;
    }
    program["range_constraints"] = std::move(ranges);
  }

  const frontend::Pt2Archive& archive_;
  const Pt2StagePlan& stage_;
  // The safetensors file `path`, open for reading (once per stage file).
  int sourceFile(const std::string& path) {
    auto it = source_files_.find(path);
    if (it != source_files_.end()) return it->second.get();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      throw Error(ErrorCode::kIo, fmt::format("cannot read --weights file '{}': {}", path, std::strerror(errno)));
    }
    return source_files_.emplace(path, FileDescriptor(fd)).first->second.get();
  }

  // An open file, closed once.
  class FileDescriptor {
   public:
    explicit FileDescriptor(int fd) : fd_(fd) {}
    FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
    FileDescriptor& operator=(FileDescriptor&&) = delete;
    ~FileDescriptor() {
      if (fd_ >= 0) ::close(fd_);
    }
    int get() const { return fd_; }

   private:
    int fd_;
  };

  caffe2::serialize::PyTorchStreamReader reader_;
  SourceArchive source_;
  std::map<std::string, FileDescriptor> source_files_;
};

}  // namespace

std::string writePt2Stage(const frontend::Pt2Archive& archive, const Pt2StagePlan& stage, const std::string& path) {
  try {
    return StageWriter(archive, stage).write(path);
  } catch (const nlohmann::ordered_json::exception& e) {
    throw StageBuildError(fmt::format("'{}': cannot write stage file '{}': {}", archive.path(), path, e.what()));
  } catch (const c10::Error& e) {
    throw StageBuildError(fmt::format("'{}': cannot write stage file '{}': {}", archive.path(), path,
                                      e.what_without_backtrace()));
  }
}

}  // namespace pipeforge::stage
