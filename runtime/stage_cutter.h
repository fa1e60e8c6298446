// How the runtime receives the cutting of a stage at its submodule calls
// (Note [Checkpointing every k-th call]): as a function its caller passes,
// stage::cutAtCalls, so that the runtime links no frontend DAG, partitioner
// or stage builder.
#pragma once

#include <functional>
#include <vector>

#include "stage/stage_segments.h"

namespace torch::jit {
struct Module;
}

namespace pipeforge::runtime {

// Cuts `stage_module` so that every `every_n`-th submodule call is a
// segment of its own, filling `segments` (stage::cutAtCalls). Throws when
// the stage cannot be cut there.
using StageCutter = std::function<stage::StageSegments(const torch::jit::Module& stage_module, int every_n,
                                                       std::vector<torch::jit::Module>& segments)>;

}  // namespace pipeforge::runtime
