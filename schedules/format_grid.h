// The step grid PyTorch prints for schedules (`_format_pipeline_order`): one
// row per step ("Step 07: "), one column per rank ("Rank 0"), idle cells blank,
// optionally a step marked with " <-- ERROR HERE".
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "schedules/action.h"

namespace pipeforge::schedules {

using ActionGrid = std::vector<std::vector<std::optional<Action>>>;  // [rank][step]

// Layout, as in PyTorch:
//  * step labels are "Step " + the step number zero-padded to the width of the
//    last step number;
//  * the header is (label width + 2) spaces, then "Rank i" labels;
//  * each rank's column is as wide as its longest action, but at least as wide
//    as a step label (PyTorch zips the labels into the width computation);
//  * cells are left-aligned and joined by one space (so rows keep trailing
//    blanks); ranks with fewer steps show blanks;
//  * every line ends in '\n'.
// PyTorch fails on a grid with no steps; this prints just the header.
std::string formatGrid(const ActionGrid& grid, std::optional<int> error_step = std::nullopt);

}  // namespace pipeforge::schedules
