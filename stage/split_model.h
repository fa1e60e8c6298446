// The whole split on disk: a model file (TorchScript .pt or torch.export
// .pt2) and a split spec -> a folder of stage files (.pt, or .pt2 for a .pt2
// model) and pipe.json. stage/split_in_memory.h is the same without files.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "partitioner/split_spec.h"
#include "stage/manifest.h"

namespace pipeforge::stage {

struct SplitRequest {
  std::string model_path;  // .pt or .pt2
  // The split spec: a file, or one already parsed (at most one of the two);
  // neither when forward has pipe_split() markers.
  std::optional<std::string> spec_path;
  std::optional<partitioner::SplitSpec> spec;
  std::string out_dir;
  bool force = false;  // replace an existing out_dir
  // Safetensors sources of the weights, by FQN (Note [Weights by FQN] in
  // frontend/pt2_weights.cpp); .pt2 models only.
  std::vector<std::string> weights;
  bool accept_unused_weights = false;
};

struct SplitSummary {
  PipeManifest manifest;
  std::string balance;  // what an automatic policy reached; empty otherwise
};

// Loads, splits and writes DIR/stage_<i>.pt and DIR/pipe.json atomically:
// everything is written to a temporary sibling folder and renamed into place,
// so a failed split leaves no partial output.
SplitSummary splitModelToDirectory(const SplitRequest& request);

}  // namespace pipeforge::stage
