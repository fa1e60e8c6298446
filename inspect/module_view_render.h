// The module view (inspect/module_view.h) as text, JSON and Graphviz DOT.
// Torch-free: it reads the view's manifest and node list only.
#pragma once

#include <string>

#include "inspect/module_view.h"

namespace pipeforge::inspect {

// module view of gpt2.pt2 at depth 2: 9 nodes, one per module call
// inputs: input_ids: int64[2, 16] (256 B)
//   node  module           class      params+buffers  ops
//      0  transformer.wte  Embedding  32768 B     1
// ...
// values crossing each cut (dtype and shape from example_inputs):
//   3|4  transformer.h.0: float32[2, 16, 32] (4096 B)  (made by node 3, last read by node 4)
//   3|4  total 4096 B
std::string moduleViewText(const ModuleView& view);

// {"source", "depth", "inputs": [{name, meta, bytes}], "nodes": [{index,
//  module, class, ops, state_bytes}], "edges": [{from, to, value, meta,
//  bytes}], "cuts": [{after, values: [...], bytes}], "outputs": [...]}
std::string moduleViewJson(const ModuleView& view);

// One box per node in a column, and a node per value between them labelled
// with its name, dtype, shape and bytes (Note [Values as nodes]).
std::string moduleViewDot(const ModuleView& view);

}  // namespace pipeforge::inspect
