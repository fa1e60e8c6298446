#include "stage/pt2_stage_writer.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cctype>
#include <map>
#include <set>

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

class StageWriter {
 public:
  StageWriter(const frontend::Pt2Archive& archive, const Pt2StagePlan& stage)
      : archive_(archive), stage_(stage), reader_(archive.path()) {}

  void write(const std::string& path) {
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
    std::vector<std::pair<std::string, at::Tensor>> filled_weights, filled_constants;
    std::map<const void*, std::string> filled_names;
    for (int l : stage_.lifted) {
      const std::string& fqn = archive_.signature().inputs[l].target;
      auto e = entries.find(fqn);
      if (e != entries.end() && !e->second->weights_source.empty()) {
        const bool constant = e->second->is_constant;
        const json& from = constant ? original_constants : original_weights;
        const at::Tensor& value = archive_.tensor(fqn);
        auto [named, fresh] = filled_names.emplace(
            value.unsafeGetTensorImpl(), fmt::format("{}_pf{}", constant ? "tensor" : "weight", filled_names.size()));
        if (fresh) (constant ? filled_constants : filled_weights).emplace_back(named->second, value);
        (constant ? constants : weights)["config"][fqn] = filledEntry(from, fqn, named->second, value);
        continue;
      }
      if (!copyEntry(original_weights, fqn, weights, weight_files) &&
          !copyEntry(original_constants, fqn, constants, constant_files)) {
        throw StageBuildError(fmt::format("'{}': no weight or constant payload for '{}'", archive_.path(), fqn));
      }
    }

    caffe2::serialize::PyTorchStreamWriter writer(path);
    writer.setMinVersion(6);  // what torch's PT2ArchiveWriter sets
    for (const auto& file : weight_files) copyRecord(writer, "data/weights/" + file);
    for (const auto& [name, value] : filled_weights) writeTensor(writer, "data/weights/" + name, value);
    writeText(writer, std::string("data/weights/") + kStageModel + "_weights_config.json", weights.dump());
    for (const auto& file : constant_files) copyRecord(writer, "data/constants/" + file);
    for (const auto& [name, value] : filled_constants) writeTensor(writer, "data/constants/" + name, value);
    writeText(writer, std::string("data/constants/") + kStageModel + "_constants_config.json", constants.dump());
    writeText(writer, std::string("models/") + kStageModel + ".json", program.dump());
    // No example inputs: torch.export.load reads an empty record as None.
    writeText(writer, std::string("data/sample_inputs/") + kStageModel + ".pt", "");
    copyRecord(writer, "archive_format");
    copyRecord(writer, "archive_version");
    writer.writeEndOfFile();
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
    for (std::int64_t s : value.contiguous().strides()) strides.push_back({{"as_int", s}});
    meta["strides"] = strides;
    meta["storage_offset"] = {{"as_int", 0}};
    return entry;
  }

  // One tensor's bytes as a record, read page by page from a mapped source;
  // then those pages are handed back (MADV_PAGEOUT: clean file pages are
  // dropped, nothing is lost), so that a split from a safetensors checkpoint
  // holds one tensor's pages at a time, not every page it wrote (they count
  // in its RSS otherwise). Memory of our own (a converted tensor) is left alone
  // by the kernel unless there is swap, which keeps its contents.
  static void writeTensor(caffe2::serialize::PyTorchStreamWriter& writer, const std::string& name,
                          const at::Tensor& value) {
    const at::Tensor dense = value.detach().contiguous();
    const std::size_t bytes = dense.numel() * dense.element_size();
    writer.writeRecord(name, dense.data_ptr(), bytes);
#ifdef MADV_PAGEOUT
    const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
    const auto begin = reinterpret_cast<std::uintptr_t>(dense.data_ptr());
    const std::uintptr_t first = (begin + page - 1) / page * page, last = (begin + bytes) / page * page;
    if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_PAGEOUT);
#endif
  }

  void copyRecord(caffe2::serialize::PyTorchStreamWriter& writer, const std::string& name) {
    auto [data, size] = reader_.getRecord(name);
    writer.writeRecord(name, data.get(), size);
  }

  static void writeText(caffe2::serialize::PyTorchStreamWriter& writer, const std::string& name,
                        const std::string& text) {
    writer.writeRecord(name, text.data(), text.size());
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
  caffe2::serialize::PyTorchStreamReader reader_;
};

}  // namespace

void writePt2Stage(const frontend::Pt2Archive& archive, const Pt2StagePlan& stage, const std::string& path) {
  try {
    StageWriter(archive, stage).write(path);
  } catch (const nlohmann::ordered_json::exception& e) {
    throw StageBuildError(fmt::format("'{}': cannot write stage file '{}': {}", archive.path(), path, e.what()));
  } catch (const c10::Error& e) {
    throw StageBuildError(fmt::format("'{}': cannot write stage file '{}': {}", archive.path(), path,
                                      e.what_without_backtrace()));
  }
}

}  // namespace pipeforge::stage
