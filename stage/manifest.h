// The manifest of a split: `pipe.json`, the dataflow between stage files.
//
// A plain value type with a JSON round trip; stage/ writes it, runtime/ and
// `pipeforge inspect` read it. Format "pipeforge.pipe/1":
//
//   {"format": "pipeforge.pipe/1", "num_stages": 2, "source": "model.pt",
//    "inputs": ["x"], "outputs": [{"from": "stage", "stage": 1, "index": 0}],
//    "stages": [{"index": 0, "file": "stage_0.pt",
//                "inputs": [{"from": "input", "index": 0}], "num_outputs": 1,
//                "parameters": [...], "buffers": [...]}, ...],
//    "tied": [["wte.weight", "lm_head.weight"]],
//    "unused": ["aux_head.weight"],
//    "input_dims": [[[4, 4], [2, null]]],   (.pt2 only: [min, max] per dimension)
//    "input_dtypes": ["int64"],             (.pt2 only; "" for a dtype we do not name)
//    "input_meta": ["float32[8, 16]"],      (only when the spec gave example_inputs)
//    "input_embeddings": [{"module": "wte", "rows": 256}],  (null for an input no embedding reads)
//    "constant_inputs": {"scale": 2.0}}     (only when forward took non-tensor arguments)
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/error.h"

namespace pipeforge::stage {

class ManifestError : public pipeforge::Error {
 public:
  explicit ManifestError(const std::string& message, ErrorCode code = ErrorCode::kUserInput) : Error(code, message) {}
};

// Where a stage input (or a root output) comes from: a root input of the
// model, or output `index` of an earlier stage.
struct ValueSource {
  enum class Kind { kInput, kStage };
  Kind kind = Kind::kInput;
  int stage = -1;  // only for kStage
  int index = 0;

  friend bool operator==(const ValueSource& a, const ValueSource& b) {
    return a.kind == b.kind && a.stage == b.stage && a.index == b.index;
  }
};

struct StageInfo {
  int index = 0;
  std::string file;                  // relative to the manifest's folder
  std::vector<ValueSource> inputs;   // in the order the stage's forward takes them
  int num_outputs = 0;               // forward always returns a tuple of this size
  std::vector<std::string> parameters;  // original FQNs held by the stage
  // "float32[64, 16]" per parameter, in that order; empty in older manifests.
  // The launcher checks tied groups with it, without loading stage files.
  std::vector<std::string> parameter_meta;
  std::vector<std::string> buffers;     // original FQNs held by the stage
  // Optional, from shape propagation: "float32[8, 16]" per output
  // (stage/value_meta.h; splits before it wrote c10's "Float[8, 16]").
  std::vector<std::string> output_meta;
  // The stage file's digest (Note [File digests]): XXH3-128 ("xxh3_128") since
  // issue 41, SHA-256 before; either may be empty in older manifests.
  std::string xxh3;
  std::string sha256;

  friend bool operator==(const StageInfo& a, const StageInfo& b) {
    return a.index == b.index && a.file == b.file && a.inputs == b.inputs && a.num_outputs == b.num_outputs &&
           a.parameters == b.parameters && a.parameter_meta == b.parameter_meta && a.buffers == b.buffers && a.output_meta == b.output_meta &&
           a.xxh3 == b.xxh3 && a.sha256 == b.sha256;
  }
};

// The sizes a model input accepts along one dimension (from a torch.export
// program: static where min == max, a range where it was made dynamic).
struct InputDim {
  int64_t min = 0;
  int64_t max = -1;  // -1: no upper bound
  friend bool operator==(const InputDim& a, const InputDim& b) { return a.min == b.min && a.max == b.max; }
};

// The embedding a model input indexes: its module's FQN and its rows.
struct InputEmbedding {
  std::string module;  // "" when no embedding reads the input
  int64_t rows = 0;
  friend bool operator==(const InputEmbedding& a, const InputEmbedding& b) {
    return a.module == b.module && a.rows == b.rows;
  }
};

struct PipeManifest {
  int num_stages = 0;
  std::string source;                    // the model file the split came from
  std::vector<std::string> inputs;       // names of the model's forward inputs
  std::vector<ValueSource> outputs;      // the model's outputs, in order
  std::vector<StageInfo> stages;
  std::vector<std::vector<std::string>> tied;  // FQN groups naming one shared tensor
  // Parameters and buffers of the model that no stage holds, because forward
  // never reads them; `pipeforge export` keeps them as they are in the model.
  std::vector<std::string> unused;
  // Per model input, the sizes it accepts per dimension, when the model says
  // (a .pt2); empty for TorchScript models, which take any size.
  std::vector<std::vector<InputDim>> input_dims;
  // Per model input of a .pt2, the dtype its program declares ("float32",
  // "int64": common/dtype_names.h; "" for one those names lack). Empty for
  // TorchScript (input_meta's dtypes stand in) and in older manifests. The
  // launcher refuses data of another kind before any rank starts (inputDtype).
  std::vector<std::string> input_dtypes;
  // Per model input, "int64[8, 128]": the example input the split ran when
  // the spec gave example_inputs (stage/value_meta.h); empty otherwise.
  std::vector<std::string> input_meta;
  // Per model input, the embedding that indexes its values directly (its
  // module's FQN and rows), so that token data is checked against it before
  // any rank starts; an empty module for an input no embedding reads. Empty
  // when no input indexes an embedding, and in older manifests.
  std::vector<InputEmbedding> input_embeddings;
  // The non-tensor forward arguments baked into the stages as constants, not
  // in `inputs` (Note [Constant inputs]): name -> value as JSON text ("2.0",
  // "true", "[2, 3]", "null", "\"mean\""). Empty in older manifests.
  std::map<std::string, std::string> constant_inputs;

  friend bool operator==(const PipeManifest& a, const PipeManifest& b) {
    return a.num_stages == b.num_stages && a.source == b.source && a.inputs == b.inputs &&
           a.outputs == b.outputs && a.stages == b.stages && a.tied == b.tied && a.unused == b.unused &&
           a.input_dims == b.input_dims && a.input_dtypes == b.input_dtypes && a.input_meta == b.input_meta &&
           a.input_embeddings == b.input_embeddings && a.constant_inputs == b.constant_inputs;
  }
};

// The dtype model input `i` takes, as common/dtype_names.h names it: a
// .pt2's declared one, else the example input's the split ran (input_meta);
// "" when the split knows neither.
std::string inputDtype(const PipeManifest& manifest, std::size_t i);

inline constexpr const char* kManifestFormat = "pipeforge.pipe/1";
inline constexpr const char* kManifestFileName = "pipe.json";

std::string manifestToJson(const PipeManifest& manifest);

// Parses and checks a manifest (format tag, stage indices, sources pointing
// only backwards). `origin` names the file in error messages.
PipeManifest manifestFromJson(const std::string& text, const std::string& origin);

// Reads DIR/pipe.json.
PipeManifest readManifest(const std::string& directory);

// Checks the stage file of `stage` in `directory` against its recorded
// SHA-256. Throws DigestError (stage/file_digest.h) naming the file.
void verifyStageFile(const std::string& directory, const StageInfo& stage);

}  // namespace pipeforge::stage
