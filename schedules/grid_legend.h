// The key printed under a step grid (format_grid.h): how to read a cell such
// as `7I0`, and what each action type in the grid does.
#pragma once

#include <string>

#include "schedules/format_grid.h"

namespace pipeforge::schedules {

// Lines that explain the cells of `grid`, naming only the action types it
// holds, in ActionType order. For a 1F1B grid with split backward:
//
//   cells: <stage><action><microbatch>, e.g. 0F1 = stage 0, action F, microbatch 1
//     F  forward
//     I  backward, input gradient only (sent to the previous stage)
//     W  backward, weight gradient only (may wait, to fill idle time)
//
// The example is a cell of the grid itself (one whose stage and microbatch
// differ where there is such a cell). Every line ends in '\n'; an empty grid
// gives "".
std::string formatGridLegend(const ActionGrid& grid);

}  // namespace pipeforge::schedules
