// What `pipeforge inspect` shows: stage modules plus their manifest.
//
// A split folder is viewed as written; a model file is viewed either whole
// (one stage) or split in memory by a spec, so every view has the same shape.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "stage/manifest.h"

// Declared only: this header stays torch-free, so a file that just passes a
// PipeView along (the CLI) does not compile torch/script.h. Files that look
// inside the stages include <torch/script.h> themselves.
namespace torch::jit {
struct Module;
}

namespace pipeforge::inspect {

struct PipeView {
  // Out of line (pipe_view.cpp), where torch::jit::Module is complete.
  PipeView();
  ~PipeView();
  PipeView(PipeView&&) noexcept;
  PipeView& operator=(PipeView&&) noexcept;

  std::vector<torch::jit::Module> stages;
  stage::PipeManifest manifest;
  std::string balance;  // a policy's balance line, when one ran
};

// `path` is a split folder (with pipe.json) or a model file; `spec_path`
// optionally splits a model file in memory.
PipeView loadPipeView(const std::string& path, const std::optional<std::string>& spec_path);

}  // namespace pipeforge::inspect
