// What `pipeforge --help` says agrees with what the commands do and with the
// README's "CLI reference" table: both model formats are named wherever a
// model file is taken, and every option a command's help shows is in that
// command's README row (and the row names no option the command lacks).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/build_paths.h"
#include "tests/support/run_command.h"

namespace pipeforge {
namespace {

testing::CommandResult help(const std::string& command) {
  return testing::runCommand(std::string(PIPEFORGE_BINARY) + (command.empty() ? "" : " " + command) + " --help");
}

// The long options of a CLI11 help text: the first word of each line of its
// "Options:" section (`  -h,--help ...`, `  --config TEXT REQUIRED ...`).
// Options in the hidden "" group are not shown, so they are never asked for.
std::set<std::string> optionsInHelp(const std::string& text) {
  std::set<std::string> options;
  std::istringstream lines(text);
  bool in_options = false;
  for (std::string line; std::getline(lines, line);) {
    if (line == "Options:") {
      in_options = true;
      continue;
    }
    if (!in_options) continue;
    if (line.empty() || line[0] != ' ') break;  // the section ends with a blank or a new heading
    if (line.rfind("  -", 0) != 0) continue;   // a wrapped description
    std::string names = line.substr(2, line.find(' ', 2) - 2);
    std::istringstream parts(names);
    for (std::string name; std::getline(parts, name, ',');) {
      if (name.rfind("--", 0) == 0) options.insert(name);
    }
  }
  options.erase("--help");
  options.erase("--version");
  return options;
}

// The subcommands `pipeforge --help` lists under "Subcommands:".
std::vector<std::string> subcommandsInHelp(const std::string& text) {
  std::vector<std::string> commands;
  std::istringstream lines(text);
  bool in_list = false;
  const std::regex entry(R"(^  ([a-z][a-z0-9_-]*)\s)");
  for (std::string line; std::getline(lines, line);) {
    if (line == "Subcommands:") {
      in_list = true;
      continue;
    }
    if (!in_list) continue;
    if (line.empty()) break;
    std::smatch m;
    if (std::regex_search(line, m, entry)) commands.push_back(m[1]);
  }
  return commands;
}

// The README's "## CLI reference" table: command -> its row (both columns).
std::map<std::string, std::string> readmeRows() {
  std::ifstream in(std::string(PIPEFORGE_SOURCE_DIR) + "/README.md");
  std::map<std::string, std::string> rows;
  bool in_section = false;
  const std::regex row(R"(^\| `pipeforge ([a-z][a-z0-9_-]*))");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("## ", 0) == 0) in_section = line == "## CLI reference";
    std::smatch m;
    if (in_section && std::regex_search(line, m, row)) rows[m[1]] += line;
  }
  return rows;
}

// Every `--name` a README row mentions (`--stop-after STEP`, `[--force]`, `--format a\|b`).
std::set<std::string> optionsInRow(const std::string& row) {
  std::set<std::string> options;
  const std::regex option(R"(--[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9])");
  for (auto it = std::sregex_iterator(row.begin(), row.end(), option); it != std::sregex_iterator(); ++it) {
    options.insert(it->str());
  }
  return options;
}

TEST(CliHelp, NamesBothModelFormatsWhereAModelIsTaken) {
  // Each of these takes a model file, which may be TorchScript or torch.export.
  for (const std::string command : {"", "split", "inspect", "export", "generate"}) {
    auto r = help(command);
    EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.output;
    EXPECT_NE(r.output.find("TorchScript (.pt"), std::string::npos) << "pipeforge " << command << " --help\n"
                                                                    << r.output;
    EXPECT_NE(r.output.find("torch.export (.pt2"), std::string::npos) << "pipeforge " << command << " --help\n"
                                                                      << r.output;
  }
}

TEST(CliHelp, ReadmeTableHasARowForEveryCommand) {
  auto r = help("");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<std::string> commands = subcommandsInHelp(r.output);
  ASSERT_GE(commands.size(), 8u) << r.output;
  const auto rows = readmeRows();
  for (const auto& command : commands) {
    EXPECT_TRUE(rows.count(command)) << "README.md's \"## CLI reference\" has no row for `pipeforge " << command
                                     << "`";
  }
  for (const auto& [command, row] : rows) {
    EXPECT_NE(std::find(commands.begin(), commands.end(), command), commands.end())
        << "README.md's \"## CLI reference\" documents `pipeforge " << command
        << "`, which `pipeforge --help` does not list";
  }
}

TEST(CliHelp, ReadmeRowOfEveryCommandNamesExactlyItsOptions) {
  auto top = help("");
  ASSERT_EQ(top.exit_code, 0) << top.output;
  const auto rows = readmeRows();
  for (const auto& command : subcommandsInHelp(top.output)) {
    auto r = help(command);
    ASSERT_EQ(r.exit_code, 0) << command << "\n" << r.output;
    const std::set<std::string> in_help = optionsInHelp(r.output);
    EXPECT_FALSE(in_help.empty()) << "no options parsed from `pipeforge " << command << " --help`:\n" << r.output;
    const auto row = rows.find(command);
    if (row == rows.end()) continue;  // ReadmeTableHasARowForEveryCommand reports it
    const std::set<std::string> in_readme = optionsInRow(row->second);
    for (const auto& option : in_help) {
      EXPECT_TRUE(in_readme.count(option)) << "`pipeforge " << command << " --help` shows " << option
                                           << ", which its row in README.md's \"## CLI reference\" does not "
                                              "mention; document it there";
    }
    for (const auto& option : in_readme) {
      // A dotted config override (--training.steps 5) is no option of its own
      // (Note [Config overrides]); the command must take --set, though.
      if (option.find('.') != std::string::npos && in_help.count("--set")) continue;
      EXPECT_TRUE(in_help.count(option)) << "README.md's \"## CLI reference\" row of `pipeforge " << command
                                         << "` mentions " << option << ", which `pipeforge " << command
                                         << " --help` does not show";
    }
  }
}

}  // namespace
}  // namespace pipeforge
