// A .pt2's parameters and buffers filled from safetensors by FQN
// (`pipeforge split --weights SRC`, `model.weights: SRC`): how a pretrained
// transformers checkpoint, or a meta-device export, gets its values.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "frontend/pt2_archive.h"

namespace at {
class Tensor;
}

namespace pipeforge::frontend {

// The metadata key of a safetensors file (written by
// pipeforge.export_on_meta) that records tied weights, as a JSON object
// {"lm_head.weight": "model.embed_tokens.weight"}: each key takes the value
// of the name it maps to, as one tensor.
inline constexpr const char* kTiedWeightsKey = "pipeforge.tied_weights";

// Note [Weights by FQN]. Replaces `tensors` (and marks `entries`) with
// values from options.weights; with no weights, refuses an archive that has
// tensors on the meta device. Throws Pt2Error naming `archive_path`, every
// problem's FQNs and the fix. Nothing is written.
void fillFromWeights(const std::string& archive_path, const Pt2OpenOptions& options,
                     std::vector<Pt2TensorEntry>& entries, std::map<std::string, at::Tensor>& tensors);

// Note [Checkpoint renames] (pt2_weights.cpp): one piece of a model tensor
// under transformers' original layout of a renamed family. The piece is
// t[index] (the whole t when index < 0), then rows [offset, offset + length)
// of that along its first dimension (all of them when length < 0).
struct OriginalPiece {
  std::string name;  // "model.layers.0.block_sparse_moe.experts.3.w1.weight"
  std::int64_t index = -1;
  std::int64_t offset = 0;
  std::int64_t length = -1;
};

// The pieces of model tensor `fqn`, of `shape`, in a renamed family's
// original layout (reading assembles them, the export cuts them); empty
// when `fqn` is no renamed family's.
std::vector<OriginalPiece> originalLayout(const std::string& fqn, const std::vector<std::int64_t>& shape);

// The piece of `t` (a view).
at::Tensor pieceOf(const at::Tensor& t, const OriginalPiece& piece);

// A meta-device export's program names the meta device wherever the model
// made a tensor itself (`arange(..., device=meta)`) and in every value's
// metadata; once its weights are filled it runs on the CPU: every such
// device becomes "cpu". Returns how many were rewritten.
int metaDevicesToCpu(nlohmann::ordered_json& program);

}  // namespace pipeforge::frontend
