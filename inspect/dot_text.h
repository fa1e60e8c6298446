// DOT text that inspect's graph views share (the pipe view and the module
// view): escaping, and the nodes that stand for values (Note [Values as nodes]
// in graph_view.cpp). Torch-free.
#pragma once

#include <string>

#include "stage/manifest.h"

namespace pipeforge::inspect {

// `s` safe inside a "quoted" DOT string: escapeDot("a\"b") == "a\\\"b".
std::string escapeDot(const std::string& s);

// The id of a value's node: "in_0" (model input 0), "v_2_1" (output 1 of stage 2).
std::string valueNodeId(const stage::ValueSource& value);

// Its label, as DOT text: `name`, then its dtype and shape and its bytes
// when the split recorded them, one per line ("mask\nint64[6, 8]\n384 B").
std::string valueNodeLabel(const std::string& name, const stage::PipeManifest& manifest,
                           const stage::ValueSource& value);

}  // namespace pipeforge::inspect
