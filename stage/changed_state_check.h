// No stage may keep a copy of module state that another stage changes.
//
// A buffer changed in place in forward (a counter's `add_`, BatchNorm's
// running statistics) must live in exactly one stage: a second stage holding
// it would read its own copy, which never changes, and the results would
// differ from the model's with no error. The dataflow planner already sends
// such buffers to the later stages that read them (Note [Mutable state across
// stages] in stage_dataflow.cpp); this check reads the built stage modules
// themselves, so it also covers what the planner could not see.
#pragma once

#include <vector>

namespace torch::jit {
struct Module;
}

namespace pipeforge::stage {

// Throws StageBuildError naming the attribute, the op that changes it, the
// stage that changes it, the stage that holds a copy, and the fix.
void checkChangedStateHeldOnce(const std::vector<torch::jit::Module>& stages);

}  // namespace pipeforge::stage
