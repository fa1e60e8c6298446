#include "schedules/format_grid.h"

#include <algorithm>

namespace pipeforge::schedules {
namespace {

void padRight(std::string& out, const std::string& text, std::size_t width) {
  out += text;
  if (text.size() < width) out.append(width - text.size(), ' ');
}

}  // namespace

std::string formatGrid(const ActionGrid& grid, std::optional<int> error_step) {
  std::size_t num_steps = 0;
  for (const auto& rank : grid) num_steps = std::max(num_steps, rank.size());

  std::size_t digits = std::to_string(num_steps == 0 ? 0 : num_steps - 1).size();
  auto stepLabel = [&](std::size_t step) {
    std::string number = std::to_string(step);
    return "Step " + std::string(digits - std::min(digits, number.size()), '0') + number;
  };
  std::size_t label_width = 5 + digits;

  // Text of every cell, and each rank's column width.
  std::vector<std::vector<std::string>> cells(grid.size());
  std::vector<std::size_t> widths(grid.size(), label_width);
  for (std::size_t r = 0; r < grid.size(); ++r) {
    cells[r].reserve(grid[r].size());
    for (const auto& action : grid[r]) {
      cells[r].push_back(action ? formatAction(*action) : std::string());
      widths[r] = std::max(widths[r], cells[r].back().size());
    }
  }

  std::string out(label_width + 2, ' ');
  for (std::size_t r = 0; r < grid.size(); ++r) {
    if (r > 0) out += ' ';
    padRight(out, "Rank " + std::to_string(r), widths[r]);
  }
  out += '\n';
  for (std::size_t step = 0; step < num_steps; ++step) {
    out += stepLabel(step);
    out += ": ";
    for (std::size_t r = 0; r < grid.size(); ++r) {
      if (r > 0) out += ' ';
      padRight(out, step < cells[r].size() ? cells[r][step] : std::string(), widths[r]);
    }
    if (error_step && static_cast<std::size_t>(*error_step) == step && *error_step >= 0) {
      out += " <-- ERROR HERE";
    }
    out += '\n';
  }
  return out;
}

}  // namespace pipeforge::schedules
