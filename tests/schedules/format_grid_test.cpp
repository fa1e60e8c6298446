#include "schedules/format_grid.h"

#include <gtest/gtest.h>

#include "schedules/program.h"

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

// The text PyTorch's _format_pipeline_order prints for the same dict.
TEST(FormatGrid, MatchesPyTorchLayout) {
  auto g = grid({{"0F0", "0F1", "", "0B0", "", "0B1"}, {"", "1F0", "1B0", "1F1", "1B1"}});
  EXPECT_EQ(formatGrid(g),
            "        Rank 0 Rank 1\n"
            "Step 0: 0F0          \n"
            "Step 1: 0F1    1F0   \n"
            "Step 2:        1B0   \n"
            "Step 3: 0B0    1F1   \n"
            "Step 4:        1B1   \n"
            "Step 5: 0B1          \n");
}

TEST(FormatGrid, MarksTheErrorStep) {
  auto g = grid({{"0F0", "0B0"}, {"", "1F0"}});
  EXPECT_EQ(formatGrid(g, 1),
            "        Rank 0 Rank 1\n"
            "Step 0: 0F0          \n"
            "Step 1: 0B0    1F0    <-- ERROR HERE\n");
}

TEST(FormatGrid, PadsStepNumbersAndWidensColumnsForLongActions) {
  ActionGrid g(2);
  for (int i = 0; i < 11; ++i) g[0].push_back(Action{0, ActionType::kForward, i, {}});
  g[1].push_back(parseAction("(1F0;2B0)OVERLAP_F_B"));
  std::string text = formatGrid(g);
  EXPECT_EQ(text.substr(0, text.find('\n') + 1),
            "         Rank 0  Rank 1              \n");
  EXPECT_NE(text.find("Step 00: 0F0     (1F0;2B0)OVERLAP_F_B\n"), std::string::npos);
  EXPECT_NE(text.find("Step 10: 0F10                        \n"), std::string::npos);
}

TEST(FormatGrid, EmptyGridPrintsOnlyTheHeader) {
  EXPECT_EQ(formatGrid(ActionGrid(2)), "        Rank 0 Rank 1\n");
}

TEST(FormatGrid, ProgramOverloadUsesItsActions) {
  Program p;
  p.num_ranks = 1;
  p.num_stages = 1;
  p.num_microbatches = 1;
  p.stage_to_rank = {0};
  p.actions = grid({{"0F0", "0B0"}});
  EXPECT_EQ(formatGrid(p), "        Rank 0\nStep 0: 0F0   \nStep 1: 0B0   \n");
}

}  // namespace
}  // namespace pipeforge::schedules
