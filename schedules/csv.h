// Schedules as CSV, in the format of PyTorch's `_dump_csv` / `_load_csv`:
// one row per rank, one cell per step, each cell an action in its text form
// (`1F0`, `(0F7;7B3)OVERLAP_F_B`) or empty for an idle step.
//
// Details that match Python's csv module as PyTorch uses it:
//  * reading accepts "\n", "\r\n" and "\r" line ends and double-quoted cells
//    ("" inside quotes is a literal quote); cells are whitespace-trimmed before
//    parsing, so "   " is an idle step, like `_Action.from_str`;
//  * an empty line is a rank with no actions; a final line end adds no row;
//  * writing puts cells between commas and a row of one idle cell as `""`
//    (Python's rule for a record that would otherwise print as nothing).
// Rows end in "\n" (the checked-in PyTorch artifacts use "\n"; Python's own
// writer would use "\r\n", which reads back the same).
#pragma once

#include <string>
#include <string_view>

#include "schedules/format_grid.h"
#include "schedules/program.h"

namespace pipeforge::schedules {

// Throws ScheduleError naming the row (rank), column (step) and the problem.
ActionGrid parseCsv(std::string_view text);
std::string formatCsv(const ActionGrid& grid);

// A Program from CSV text. The shape is inferred, as PyTorch's `_load_csv`
// infers the stage-to-rank mapping: ranks = rows, stages = highest stage + 1,
// microbatches = highest microbatch + 1, each stage on the rank whose row has
// its actions. Throws ScheduleError when there are no actions, a stage in
// 0..highest never appears, or a stage appears on two rows.
Program programFromCsv(std::string_view text);
std::string programToCsv(const Program& program);

// File forms; ScheduleError when the file cannot be opened, read or written.
Program loadCsvFile(const std::string& path);
void dumpCsvFile(const Program& program, const std::string& path);

}  // namespace pipeforge::schedules
