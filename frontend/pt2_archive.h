// Reading a torch.export `.pt2` archive: the ExportedProgram JSON, its graph
// signature, per-node module stacks, and its weights and constants as tensors.
//
// The zip is opened with LibTorch's own PyTorchStreamReader, the JSON parsed
// with nlohmann-json. Only what torch >= 2.9 writes is read (archive_format
// `pt2`, archive_version 0, raw weights with a payload config, schema 8.x);
// everything else is refused with a Pt2Error that names the fix.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "frontend/errors.h"

namespace at {
class Tensor;
}

namespace pipeforge::frontend {


// What a zip holds, decided by its content (the file name only breaks ties
// for files too broken to open).
enum class ArchiveKind {
  kTorchScript,     // anything that is not a torch.export archive
  kPt2,             // <root>/archive_format == "pt2" (torch >= 2.8), or a broken `.pt2`
  kLegacyExport,    // torch 2.1-2.7: serialized_exported_program.json at the top level
};

ArchiveKind detectArchiveKind(const std::string& path);

// One frame of a node's `nn_module_stack`, outermost first.
struct Pt2ModuleFrame {
  std::string key;   // tracer key, e.g. "L__self__blocks.0"; "@<n>" marks repeated calls
  std::string path;  // module FQN, "" for the root
  std::string type;  // "<module>.<qualname>", e.g. "torch.nn.modules.linear.Linear"
};

enum class Pt2InputKind { kUserInput, kParameter, kBuffer, kTensorConstant, kCustomObject, kToken, kConstantInput };
enum class Pt2OutputKind {
  kUserOutput,
  kLossOutput,
  kBufferMutation,
  kParameterMutation,
  kGradientToParameter,
  kGradientToUserInput,
  kUserInputMutation,
  kToken,
};

struct Pt2InputSpec {
  Pt2InputKind kind = Pt2InputKind::kUserInput;
  std::string value;   // the graph value (placeholder) name: "x", "p_fc_weight"
  std::string target;  // FQN of the parameter / buffer / constant; "" for user inputs
  bool persistent = true;
};

struct Pt2OutputSpec {
  Pt2OutputKind kind = Pt2OutputKind::kUserOutput;
  std::string value;   // the graph value returned; "" when the output is not a tensor
  std::string target;  // FQN the output mutates (buffer/parameter/user input), else ""
  std::string literal; // for a non-tensor output: its argument as JSON text
};

struct Pt2Signature {
  std::vector<Pt2InputSpec> inputs;    // 1:1 with the graph's placeholders, in order
  std::vector<Pt2OutputSpec> outputs;  // 1:1 with the graph's outputs, in order
};

struct Pt2Node {
  std::string name;    // graph-unique; "" in schemas without node names
  std::string target;  // "torch.ops.aten.linear.default", "torch.ops.higher_order.cond", "_operator.mul"
  std::vector<Pt2ModuleFrame> module_stack;  // empty when the node carries none
};

struct Pt2TensorEntry {
  std::string fqn;
  bool is_parameter = false;  // else a buffer or constant
  bool is_constant = false;   // from the constants config (lifted tensor constants, non-persistent buffers)
  bool on_meta = false;       // exported on the meta device: the archive holds no value for it
  // Where its value comes from: "" the archive's own record; else the
  // --weights source that gave it (Note [Weights by FQN] in pt2_weights.cpp).
  std::string weights_source;
  // Set by a --weights source: the value held is a view of that source's
  // mapping (its pages can be dropped once written, Note [Stage files at the
  // disk's speed] in common/torch_zip.h).
  bool source_view = false;
  // Then where its bytes lie: the safetensors file and their offset in it
  // (a split copies them file to file, Note [Stage files at the disk's speed]).
  std::string source_file;
  std::uint64_t source_offset = 0;
  // The c10::ScalarType (as its integer) the export declares, when the
  // source holds another floating dtype (a bf16 checkpoint of an fp32
  // export): the value held stays the source's until tensor() converts it,
  // so that a split converts one tensor at a time as it writes it. -1: none.
  int convert_to = -1;
};

// How to open an archive: weights from safetensors by FQN (`pipeforge split
// --weights`, `model.weights`), in order: a later source fills what earlier
// ones lack.
struct Pt2OpenOptions {
  std::vector<std::string> weights;
  bool accept_unused_weights = false;  // names in the sources that no tensor of the model takes
  // false: only the program and the tensors' names, dtypes and shapes are
  // wanted (a meta export opens without weights).
  bool need_values = true;
};

class Pt2Archive {
 public:
  // Opens and checks `path`; maps every weight and constant, from the
  // archive or from options.weights. Throws Pt2Error (an export made on the
  // meta device without weights to fill it, a weight the sources lack or
  // that does not fit, names no tensor takes).
  static Pt2Archive open(const std::string& path, const Pt2OpenOptions& options = {});

  ~Pt2Archive();
  Pt2Archive(Pt2Archive&&) noexcept;
  Pt2Archive& operator=(Pt2Archive&&) noexcept;

  const std::string& path() const;
  const std::string& modelName() const;            // "model" for torch.export.save
  const std::string& schemaVersion() const;        // "8.20"
  const std::string& torchVersion() const;         // writer's torch, "2.13.0+cpu"
  const std::vector<std::string>& verifiers() const;  // ["TRAINING"] for the default export IR

  const Pt2Signature& signature() const;
  // Top-level graph nodes in graph order (a topological order).
  const std::vector<Pt2Node>& nodes() const;
  // Module FQNs from module_call_graph ("" first), in the model's definition order.
  const std::vector<std::string>& moduleCallGraph() const;

  // Raw JSON, for the importer: the top-level Graph object and the whole program.
  const nlohmann::ordered_json& graphJson() const;
  const nlohmann::ordered_json& programJson() const;

  // Weights then constants, in config order. Names of one storage view (tied
  // weights: wte.weight and lm_head.weight) map to the same tensor object.
  const std::vector<Pt2TensorEntry>& tensors() const;
  // In the dtype the export declares; throws Pt2Error when absent. A value
  // still to convert (Pt2TensorEntry::convert_to) is converted here, once,
  // for every name of its tie.
  const at::Tensor& tensor(const std::string& fqn) const;
  // The value as held: for an entry with convert_to >= 0, the source's
  // tensor in the source's dtype. For readers that convert as they go, or
  // want only names and shapes. Throws Pt2Error when absent.
  const at::Tensor& stored(const std::string& fqn) const;
  // The entry of `fqn`; throws Pt2Error when absent.
  const Pt2TensorEntry& entry(const std::string& fqn) const;
  bool hasTensor(const std::string& fqn) const;

 private:
  struct Impl;
  explicit Pt2Archive(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// An integer field of the program JSON, or a Pt2Error naming `what` when it is
// not a whole number or does not fit (1.5, 1e300 and 2^40 as a dtype code are
// refused: nlohmann's get<int>() would truncate or overflow them).
int64_t pt2Int64(const nlohmann::ordered_json& value, const std::string& what);
int pt2Int(const nlohmann::ordered_json& value, const std::string& what);

// The c10::ScalarType, as its integer, of a PT2 schema dtype code (the
// schema numbers dtypes its own way: 5 is int64 there, Half in c10). `what`
// names the tensor or node for the error on an unknown code.
int c10ScalarTypeOf(int pt2_code, const std::string& what);

// The top-level nodes of a Graph object (its "nodes"), as Pt2Archive::nodes() lists them.
std::vector<Pt2Node> pt2GraphNodes(const nlohmann::ordered_json& graph);

// Parses one `nn_module_stack` metadata string ("key,path,type;key,path,type").
// Frames added by export passes without module information are dropped.
std::vector<Pt2ModuleFrame> parseModuleStack(const std::string& text);

// Where forward made a node, from its `stack_trace` metadata: the innermost
// frame outside torch's own package (the model's line, not F.linear's): its
// file name (no folders), line and code. Empty when the node carries
// no trace.
struct Pt2SourceLocation {
  std::string file;  // "modeling_llama.py"
  int line = 0;      // 0 when unknown
  std::string code;  // "cos = emb.cos() * self.attention_scaling"
};
Pt2SourceLocation pt2SourceLocation(const nlohmann::ordered_json& node);
// The same as "modeling_llama.py:98", or "".
std::string pt2SourceLine(const nlohmann::ordered_json& node);

// Every value name an Argument JSON (or a list of them) reads, in order;
// higher-order subgraphs (`as_graph`) are not entered.
void pt2ValueNames(const nlohmann::ordered_json& arg, std::vector<std::string>& out);
// The value names a graph node reads (its inputs) and makes (its outputs).
std::vector<std::string> pt2NodeUses(const nlohmann::ordered_json& node);
std::vector<std::string> pt2NodeDefs(const nlohmann::ordered_json& node);

}  // namespace pipeforge::frontend
