// Graph views of a pipe: JSON (DAG + partition), Graphviz DOT, and SVG.
//
// Each stage's forward becomes a DAG (frontend::buildDag); the DOT view draws
// one coloured cluster per stage, and every model input and every value that
// crosses a stage boundary as a node of its own, labelled with its name and,
// when the split recorded them, dtype, shape and bytes (Note [Values as nodes]).
#pragma once

#include <optional>
#include <string>

#include "inspect/pipe_view.h"

namespace pipeforge::inspect {

// `only_stage` limits the view to one stage (cross edges into/out of it stay).
std::string pipeJson(const PipeView& view, std::optional<int> only_stage);
std::string pipeDot(const PipeView& view, std::optional<int> only_stage);

// Lays out DOT text with Graphviz's `dot` engine and renders SVG.
std::string renderSvg(const std::string& dot);

}  // namespace pipeforge::inspect
