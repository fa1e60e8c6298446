// What `pipeforge inspect` shows: stage modules plus their manifest.
//
// A split folder is viewed as written; a model file is viewed either whole
// (one stage) or split in memory by a spec, so every view has the same shape.
#pragma once

#include <torch/script.h>

#include <optional>
#include <string>
#include <vector>

#include "stage/manifest.h"

namespace pipeforge::inspect {

struct PipeView {
  std::vector<torch::jit::Module> stages;
  stage::PipeManifest manifest;
  std::string balance;  // a policy's balance line, when one ran
};

// `path` is a split folder (with pipe.json) or a model file; `spec_path`
// optionally splits a model file in memory.
PipeView loadPipeView(const std::string& path, const std::optional<std::string>& spec_path);

}  // namespace pipeforge::inspect
