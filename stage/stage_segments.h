// A stage cut at its submodule calls, for checkpointing every k-th call
// (Note [Checkpointing every k-th call] in stage/stage_segments.cpp). The
// runtime does not link this: its callers pass cutAtCalls to it
// (runtime::StageCutter).
#pragma once

#include <string>
#include <vector>

#include "stage/manifest.h"

namespace torch::jit {
struct Module;
}

namespace pipeforge::stage {

// The segments of one stage as a dataflow: segment j is "stage" j of
// `dataflow`, whose kInput sources are the stage's module inputs and whose
// outputs are the stage's outputs. Each segment module shares its
// parameters and buffers with the stage module (the same tensors).
struct StageSegments {
  PipeManifest dataflow;
  std::vector<bool> checkpointed;  // one per segment
  std::vector<std::string> calls;  // what each segment calls, for messages ("blocks.1")
};

// Cuts `stage_module` so that the k-th, 2k-th, ...
// submodule call its forward makes is a segment of its own, marked
// checkpointed; the code between those calls forms the other segments.
// Fills `segments` (one module per segment). A stage with fewer than k calls
// gives no segments. Throws whatever the frontend, partitioner or stage
// builder throws when the stage cannot be cut there; the runtime turns that
// into the error its user sees.
StageSegments cutAtCalls(const torch::jit::Module& stage_module, int every_n,
                         std::vector<torch::jit::Module>& segments);

}  // namespace pipeforge::stage
