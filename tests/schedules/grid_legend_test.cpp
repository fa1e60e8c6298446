#include "schedules/grid_legend.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace pipeforge::schedules {
namespace {

ActionGrid grid(const std::vector<std::vector<std::string>>& cells) {
  ActionGrid out;
  for (const auto& rank : cells) {
    out.emplace_back();
    for (const auto& cell : rank) {
      if (cell.empty()) {
        out.back().emplace_back();
      } else {
        out.back().push_back(parseAction(cell));
      }
    }
  }
  return out;
}

TEST(GridLegend, NamesOnlyTheTypesInTheGridWithAnExampleCell) {
  auto g = grid({{"0F0", "0F1", "", "0I0", "0W0"}, {"", "1F0", "1I0", "1W0", "1F1"}});
  EXPECT_EQ(formatGridLegend(g),
            "cells: <stage><action><microbatch>, e.g. 0F1 = stage 0, action F, microbatch 1\n"
            "  F  forward\n"
            "  I  backward, input gradient only (sent to the previous stage)\n"
            "  W  backward, weight gradient only (may wait, to fill idle time)\n");
}

TEST(GridLegend, LoweredGridExplainsMessagesAlignedByTheLongestName) {
  auto g = grid({{"0F0", "0SEND_F0", "0RECV_B0", "0B0"}, {"1RECV_F0", "1F0", "1B0", "1SEND_B0"}});
  EXPECT_EQ(formatGridLegend(g),
            "cells: <stage><action><microbatch>, e.g. 1RECV_F0 = stage 1, action RECV_F, microbatch 0\n"
            "  F       forward\n"
            "  B       full backward (I and W together)\n"
            "  SEND_F  send the forward output to the next stage\n"
            "  RECV_F  receive the forward input from the previous stage\n"
            "  SEND_B  send the input gradient to the previous stage\n"
            "  RECV_B  receive the output gradient from the next stage\n");
}

TEST(GridLegend, CompositeCellsCountTheirHalves) {
  auto g = grid({{"(0F1;0B0)OVERLAP_F_B"}});
  EXPECT_EQ(formatGridLegend(g),
            "cells: <stage><action><microbatch>, e.g. 0F1 = stage 0, action F, microbatch 1\n"
            "  F            forward\n"
            "  B            full backward (I and W together)\n"
            "  OVERLAP_F_B  (a;b)OVERLAP_F_B: the forward a and the backward b run together\n");
}

TEST(GridLegend, EmptyGridHasNoLegend) { EXPECT_EQ(formatGridLegend(ActionGrid{{}, {}}), ""); }

}  // namespace
}  // namespace pipeforge::schedules
