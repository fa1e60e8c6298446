#include "schedules/csv.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <fmt/format.h>

namespace pipeforge::schedules {
namespace {

bool isBlank(std::string_view text) {
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; });
}

std::optional<Action> parseCell(const std::string& cell, std::size_t row, std::size_t column) {
  if (isBlank(cell)) return std::nullopt;
  try {
    return parseAction(cell);
  } catch (const ScheduleError& error) {
    throw ScheduleError(fmt::format("CSV row {} (rank {}), column {} (step {}): {}", row + 1, row,
                                    column + 1, column, error.what()));
  }
}

[[noreturn]] void failAt(std::size_t line, std::string_view why) {
  throw ScheduleError(fmt::format(
      "CSV line {}: {}; expected one row per rank of comma-separated actions such as "
      "0F0,0F1,,0B0 (empty cells are idle steps)",
      line, why));
}

}  // namespace

ActionGrid parseCsv(std::string_view text) {
  std::vector<std::vector<std::string>> records;
  std::vector<std::string> record;
  bool in_record = false;  // something of the current line has been read
  std::size_t line = 1;
  std::size_t i = 0;
  const std::size_t n = text.size();

  auto endRecord = [&]() {
    records.push_back(std::move(record));
    record.clear();
    in_record = false;
  };
  // Consumes one line end at text[i] ("\r\n", "\r" or "\n").
  auto consumeLineEnd = [&]() {
    if (text[i] == '\r' && i + 1 < n && text[i + 1] == '\n') ++i;
    ++i;
    ++line;
  };

  while (i < n) {
    if (!in_record && (text[i] == '\n' || text[i] == '\r')) {
      // An empty line: a rank without actions (Python's csv yields []).
      consumeLineEnd();
      endRecord();
      continue;
    }
    in_record = true;
    std::string field;
    if (text[i] == '"') {
      std::size_t open_line = line;
      ++i;
      while (true) {
        if (i >= n) failAt(open_line, "a quoted cell is never closed");
        char c = text[i];
        if (c == '"') {
          if (i + 1 < n && text[i + 1] == '"') {
            field += '"';
            i += 2;
            continue;
          }
          ++i;
          break;
        }
        if (c == '\n') ++line;
        field += c;
        ++i;
      }
      if (i < n && text[i] != ',' && text[i] != '\n' && text[i] != '\r') {
        failAt(line, "a quoted cell must be followed by ',' or the end of the line");
      }
    } else {
      while (i < n && text[i] != ',' && text[i] != '\n' && text[i] != '\r') field += text[i++];
    }
    record.push_back(std::move(field));
    if (i >= n) {
      endRecord();
      break;
    }
    if (text[i] == ',') {
      ++i;
      if (i >= n || text[i] == '\n' || text[i] == '\r') {
        record.emplace_back();  // a trailing comma ends in an empty cell
        if (i >= n) {
          endRecord();
          break;
        }
        consumeLineEnd();
        endRecord();
      }
      continue;
    }
    consumeLineEnd();
    endRecord();
  }

  ActionGrid grid(records.size());
  for (std::size_t r = 0; r < records.size(); ++r) {
    grid[r].reserve(records[r].size());
    for (std::size_t c = 0; c < records[r].size(); ++c) {
      grid[r].push_back(parseCell(records[r][c], r, c));
    }
  }
  return grid;
}

std::string formatCsv(const ActionGrid& grid) {
  std::string out;
  for (const auto& row : grid) {
    if (row.size() == 1 && !row[0]) {
      out += "\"\"\n";  // Python writes a record of one empty field as ""
      continue;
    }
    for (std::size_t i = 0; i < row.size(); ++i) {
      if (i > 0) out += ',';
      if (row[i]) out += formatAction(*row[i]);
    }
    out += '\n';
  }
  return out;
}

Program programFromCsv(std::string_view text) {
  ActionGrid grid = parseCsv(text);
  int max_stage = -1;
  int max_microbatch = -1;
  std::set<int> stages;
  for (const auto& row : grid) {
    for (const auto& cell : row) {
      if (!cell) continue;
      for (int stage : stagesOf(*cell)) {
        max_stage = std::max(max_stage, stage);
        stages.insert(stage);
      }
      if (cell->microbatch) max_microbatch = std::max(max_microbatch, *cell->microbatch);
      for (const auto& sub : cell->sub_actions) {
        if (sub.microbatch) max_microbatch = std::max(max_microbatch, *sub.microbatch);
      }
    }
  }
  if (max_stage < 0 || max_microbatch < 0) {
    throw ScheduleError(
        "CSV schedule has no actions with a stage and microbatch; expected one row per rank such "
        "as 0F0,0F1,,0B0,0B1");
  }

  // Every stage 0..max_stage must appear. Checked before the per-stage tables
  // are sized, so `2147483647F0` is this error, not a 2^31-entry allocation.
  int next_stage = 0;
  for (int stage : stages) {
    if (stage != next_stage) break;
    ++next_stage;
  }
  if (next_stage <= max_stage) {
    throw ScheduleError(fmt::format(
        "CSV schedule never mentions stage {} although it has stages up to {}; every stage "
        "0..{} needs actions so its rank is known",
        next_stage, max_stage, max_stage));
  }
  if (max_microbatch == std::numeric_limits<int>::max()) {
    throw ScheduleError(fmt::format(
        "CSV schedule names microbatch {}, so it would have more microbatches than an int holds; "
        "microbatches are numbered 0..m-1",
        max_microbatch));
  }

  std::vector<int> stage_to_rank(max_stage + 1, -1);
  std::vector<std::size_t> first_step(max_stage + 1, 0);
  for (std::size_t r = 0; r < grid.size(); ++r) {
    for (std::size_t step = 0; step < grid[r].size(); ++step) {
      if (!grid[r][step]) continue;
      for (int stage : stagesOf(*grid[r][step])) {
        int& owner = stage_to_rank[stage];
        if (owner == -1) {
          owner = static_cast<int>(r);
          first_step[stage] = step;
        } else if (owner != static_cast<int>(r)) {
          throw ScheduleError(fmt::format(
              "CSV schedule puts stage {} on rank {} (step {}) and on rank {} (step {}); each "
              "stage must run on exactly one rank (one CSV row)",
              stage, owner, first_step[stage], r, step));
        }
      }
    }
  }
  Program program;
  program.num_ranks = static_cast<int>(grid.size());
  program.num_stages = max_stage + 1;
  program.num_microbatches = max_microbatch + 1;
  program.stage_to_rank = std::move(stage_to_rank);
  program.actions = std::move(grid);
  return program;
}

std::string programToCsv(const Program& program) { return formatCsv(program.actions); }

Program loadCsvFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ScheduleError(fmt::format("cannot open schedule CSV '{}' for reading", path));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) throw ScheduleError(fmt::format("cannot read schedule CSV '{}'", path), ErrorCode::kIo);
  try {
    return programFromCsv(buffer.str());
  } catch (const ScheduleError& error) {
    throw ScheduleError(fmt::format("{}: {}", path, error.what()));
  }
}

void dumpCsvFile(const Program& program, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw ScheduleError(fmt::format("cannot open '{}' for writing the schedule CSV", path), ErrorCode::kIo);
  out << programToCsv(program);
  out.flush();
  if (!out) throw ScheduleError(fmt::format("cannot write the schedule CSV to '{}'", path), ErrorCode::kIo);
}

}  // namespace pipeforge::schedules
