// The module view of `pipeforge inspect --depth N`: one node per module call
// N levels of calls below forward (a transformer's blocks, not its aten ops),
// and the values that cross each cut between them, with shapes and bytes.
//
// Note [Module view as a fine split]: the view is the model split before
// every call at that depth (stage::splitAtCalls), so a node is exactly what a
// pipeline stage starting at that call would run, and the values crossing a
// cut are exactly what a split there would send: the same DAG, partitioner
// and stage builder as `pipeforge split`, not a second analysis that could
// disagree with it. Ops between two calls (GPT-2's position ids, its mask)
// join the call before them, as the policies' units do.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "stage/manifest.h"

namespace pipeforge::inspect {

struct ModuleNode {
  std::string module;          // FQN of the call the node starts with ("" when forward calls nothing)
  std::string class_name;      // its class, as the tree prints it ("GPT2Block")
  int ops = 0;                 // other vertices it runs: aten ops and control flow
  int64_t state_bytes = 0;     // bytes of the parameters and buffers it holds (tied ones in each holder)
};

struct ModuleView {
  std::string source;          // the model file
  int depth = 1;
  bool spec_cuts_ignored = false;  // the spec named split points or a policy, which this view does not draw
  stage::PipeManifest manifest;    // node k is stage k; output_meta / input_meta from example_inputs
  std::vector<ModuleNode> nodes;
};

// `depth` >= 1: 1 draws the modules forward calls itself, 2 also opens those
// that call submodules, and so on (calls, not FQN dots: GPT-2's transformer.h.0
// is called by transformer, so it is at depth 2). Throws Error(kUserInput)
// for a depth below 1 and for a split folder.
ModuleView loadModuleView(const std::string& path, const std::optional<std::string>& spec_path, int depth);

}  // namespace pipeforge::inspect
