// Side by side with torch.distributed.pipelining: every schedule PyTorch
// builds, dumped at build time by pytorch/dump_pytorch_orders.py, against
// ours, cell for cell with the idle steps.
//
// Per case of the dump's index.json (class, p ranks, v stages per rank, m
// microbatches), and per file the dump holds:
//   compute  generateSchedule(name, {p, v, m})   vs PyTorch's compute-only order
//   order    addReduceGrad(ours)                  vs `pipeline_order` of the
//                                                    single-stage classes, which
//                                                    PyTorch returns reduce-grad'ed
//   comms    lowerAsPyTorch(ours) (below)         vs `pipeline_order_with_comms`
//                                                    (single-stage: `_add_send_recv`
//                                                    of `pipeline_order`)
// Configurations PyTorch rejects we must reject too. Differences we keep on
// purpose are in kExpectedDifferences, each naming the Note in the generator
// that explains it; any other difference fails, and so does an expected one
// that no longer occurs. This binary links no torch: without a Python with
// torch at build time the tests skip and say why.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "schedules/csv.h"
#include "schedules/generate.h"
#include "schedules/lower.h"

namespace pipeforge::schedules {
namespace {

const std::string kOrdersDir = PIPEFORGE_PYTORCH_ORDERS_DIR;

// ---------------------------------------------------------------------------
// The dump

struct DumpedCase {
  std::string torch_class;
  std::string schedule;  // our generator's name
  int p = 0;
  int v = 0;
  int m = 0;
  std::map<std::string, std::string> files;   // "compute"/"order"/"comms" -> file name
  std::map<std::string, std::string> errors;  // a file PyTorch failed to produce -> why
  std::string error;                          // rejected configurations: PyTorch's error

  std::string label() const {
    return fmt::format("{} p={} v={} m={} ({})", schedule, p, v, m, torch_class);
  }
};

struct DumpedClass {
  std::string torch_class;
  std::string schedule;  // empty when the dump knows no generator for it
  std::string kind;      // "single", "multi" or "unmapped"
};

struct Dump {
  std::string torch_version;
  std::vector<DumpedClass> classes;
  std::vector<DumpedCase> cases;
  std::vector<DumpedCase> rejected;
};

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Why the dump is missing on purpose (written by CMake when no Python with
// torch.distributed.pipelining was found), or empty.
std::string unavailableReason() {
  std::string reason = readFile(kOrdersDir + "/UNAVAILABLE.txt");
  while (!reason.empty() && (reason.back() == '\n' || reason.back() == '\r')) reason.pop_back();
  return reason;
}

DumpedCase caseFromJson(const nlohmann::json& j) {
  DumpedCase c;
  c.torch_class = j.at("torch_class").get<std::string>();
  c.schedule = j.at("schedule").get<std::string>();
  c.p = j.at("ranks").get<int>();
  c.v = j.at("stages_per_rank").get<int>();
  c.m = j.at("microbatches").get<int>();
  if (j.contains("files")) c.files = j.at("files").get<std::map<std::string, std::string>>();
  if (j.contains("errors")) c.errors = j.at("errors").get<std::map<std::string, std::string>>();
  if (j.contains("error")) c.error = j.at("error").get<std::string>();
  return c;
}

// The index, or a failure that says how to produce it.
::testing::AssertionResult loadDump(Dump& dump) {
  const std::string path = kOrdersDir + "/index.json";
  const std::string text = readFile(path);
  if (text.empty()) {
    return ::testing::AssertionFailure()
           << "missing " << path << "; the build writes it (target pytorch_orders, "
           << "tests/schedules/pytorch/dump_pytorch_orders.py): run cmake --build on this build "
           << "folder, or reconfigure if the Python with torch went away";
  }
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    dump.torch_version = j.at("torch_version").get<std::string>();
    for (const auto& c : j.at("classes")) {
      DumpedClass entry;
      entry.torch_class = c.at("torch_class").get<std::string>();
      entry.schedule = c.at("schedule").is_null() ? "" : c.at("schedule").get<std::string>();
      entry.kind = c.at("kind").get<std::string>();
      dump.classes.push_back(entry);
    }
    for (const auto& c : j.at("cases")) dump.cases.push_back(caseFromJson(c));
    for (const auto& c : j.at("rejected")) dump.rejected.push_back(caseFromJson(c));
  } catch (const nlohmann::json::exception& e) {
    return ::testing::AssertionFailure()
           << path << " is not the index dump_pytorch_orders.py writes: " << e.what()
           << "; rebuild the target pytorch_orders";
  }
  return ::testing::AssertionSuccess();
}

#define PIPEFORGE_LOAD_DUMP_OR_SKIP(dump)                                               \
  do {                                                                                  \
    if (std::string why = unavailableReason(); !why.empty()) GTEST_SKIP() << why;      \
    ASSERT_TRUE(loadDump(dump));                                                        \
  } while (false)

// ---------------------------------------------------------------------------
// Our side

// PyTorch's lowering of a generated compute-only schedule,
// `_PipelineScheduleRuntime._prepare_schedule_with_comms` with its defaults:
// per rank `_add_unshard_reshard` (3 active stages) then `_add_reduce_grad`,
// then `_add_send_recv`. It keeps I and W apart (no `_merge_bw`).
Program lowerAsPyTorch(const Program& compute) {
  return addSendRecv(addReduceGrad(addUnshardReshard(compute, 3)));
}

bool isSingleStage(const std::string& kind) { return kind == "single"; }

// What we produce for one of the dump's files.
ActionGrid ours(const Program& compute, const std::string& file, bool single_stage) {
  if (file == "compute") return compute.actions;
  if (file == "order") return addReduceGrad(compute).actions;
  // comms
  if (single_stage) return addSendRecv(addReduceGrad(compute)).actions;
  return lowerAsPyTorch(compute).actions;
}

// ---------------------------------------------------------------------------
// Comparison

std::string cellText(const std::vector<std::optional<Action>>& row, std::size_t step) {
  if (step >= row.size()) return "(past the end)";
  if (!row[step]) return "(idle)";
  return formatAction(*row[step]);
}

struct CellDifference {
  std::size_t rank = 0;
  std::size_t step = 0;
  std::string ours, theirs;
};

std::vector<CellDifference> compareGrids(const ActionGrid& ours, const ActionGrid& theirs) {
  std::vector<CellDifference> out;
  const std::size_t ranks = std::max(ours.size(), theirs.size());
  const std::vector<std::optional<Action>> none;
  for (std::size_t r = 0; r < ranks; ++r) {
    const auto& a = r < ours.size() ? ours[r] : none;
    const auto& b = r < theirs.size() ? theirs[r] : none;
    for (std::size_t step = 0; step < std::max(a.size(), b.size()); ++step) {
      std::string x = cellText(a, step);
      std::string y = cellText(b, step);
      if (x != y) out.push_back({r, step, x, y});
    }
  }
  return out;
}

std::string describe(const std::vector<CellDifference>& diffs, std::size_t shown = 8) {
  std::string text;
  for (std::size_t i = 0; i < diffs.size() && i < shown; ++i) {
    text += fmt::format("\n  rank {}, step {}: ours {}, PyTorch's {}", diffs[i].rank,
                        diffs[i].step, diffs[i].ours, diffs[i].theirs);
  }
  if (diffs.size() > shown) text += fmt::format("\n  ... and {} more", diffs.size() - shown);
  return text;
}

// Python's csv writer ends rows in "\r\n"; ours in "\n".
std::string withCrLf(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '\n') out += '\r';
    out += c;
  }
  return out;
}

// ---------------------------------------------------------------------------
// Differences we keep on purpose
//
// Each is checked, not waived: PyTorch's grid is first turned into what we
// produce instead (`as_ours`), then compared cell for cell (kCells) or rank by
// rank with the idle steps dropped from both sides (kOrderOnly). kPyTorchFails:
// PyTorch cannot produce the file (its error must say `pytorch_error`), and we
// must. An entry whose difference no case shows any more fails the test, so
// the table and the Notes stay true.

enum class Match { kCells, kOrderOnly, kPyTorchFails };

struct ExpectedDifference {
  std::string_view schedule;
  std::string_view file;
  std::string_view note;  // where the generator explains it
  Match match;
  ActionGrid (*as_ours)(const DumpedCase&, ActionGrid);  // nullptr: taken as is
  std::string_view pytorch_error;                         // kPyTorchFails only
};

// Schedule1F1B's list numbers the last rank's forwards 1..m.
ActionGrid numberLastRankForwardsFromZero(const DumpedCase& c, ActionGrid grid) {
  if (grid.size() != static_cast<std::size_t>(c.p)) return grid;
  for (auto& cell : grid.back()) {
    if (cell && cell->type == ActionType::kForward && cell->microbatch) --*cell->microbatch;
  }
  return grid;
}

constexpr std::string_view kOneFOneBNote =
    "Note [1F1B against PyTorch's order] in schedules/gen_1f1b.cpp";

const ExpectedDifference kExpectedDifferences[] = {
    {"1F1B", "compute", kOneFOneBNote, Match::kOrderOnly, &numberLastRankForwardsFromZero, ""},
    {"1F1B", "order", kOneFOneBNote, Match::kCells, &numberLastRankForwardsFromZero, ""},
    {"1F1B", "comms", kOneFOneBNote, Match::kPyTorchFails, nullptr,
     "Malformed compute schedule, can't schedule sends/recvs"},
};

const ExpectedDifference* expectedDifference(std::string_view schedule, std::string_view file) {
  for (const auto& entry : kExpectedDifferences) {
    if (entry.schedule == schedule && entry.file == file) return &entry;
  }
  return nullptr;
}

ActionGrid withoutIdleSteps(ActionGrid grid) {
  for (auto& row : grid) {
    row.erase(std::remove(row.begin(), row.end(), std::nullopt), row.end());
  }
  return grid;
}

struct ClassTally {
  int cases = 0;
  int files_equal = 0;
  int files_documented = 0;
  std::set<const ExpectedDifference*> seen;  // documented differences that occurred
};

// Compares one dumped file with ours; failures name the case, file, rank and step.
void compareFile(const DumpedCase& c, const std::string& file, const std::string& name,
                 const ActionGrid& mine, ClassTally& tally) {
  const std::string path = kOrdersDir + "/" + name;
  const std::string text = readFile(path);
  ActionGrid theirs;
  try {
    theirs = parseCsv(text);
  } catch (const ScheduleError& e) {
    ADD_FAILURE() << path << " does not parse as a schedule CSV: " << e.what();
    return;
  }
  const std::string where = fmt::format("{}, {} ({})", c.label(), file, name);
  std::vector<CellDifference> diffs = compareGrids(mine, theirs);
  const ExpectedDifference* expected = expectedDifference(c.schedule, file);
  if (diffs.empty()) {
    // Same cells: our CSV writer must then write PyTorch's bytes.
    EXPECT_EQ(withCrLf(formatCsv(mine)), text) << where;
    ++tally.files_equal;
    return;
  }
  if (expected == nullptr) {
    ADD_FAILURE() << where << ": " << diffs.size() << " cells differ (ours vs PyTorch's):"
                  << describe(diffs);
    return;
  }
  if (expected->match == Match::kPyTorchFails) {
    ADD_FAILURE() << where << ": PyTorch now produces this file, but " << expected->note
                  << " expects it to fail; " << diffs.size() << " cells differ:" << describe(diffs);
    return;
  }
  tally.seen.insert(expected);
  ++tally.files_documented;
  ActionGrid as_ours = expected->as_ours ? expected->as_ours(c, theirs) : theirs;
  std::vector<CellDifference> left =
      expected->match == Match::kCells
          ? compareGrids(mine, as_ours)
          : compareGrids(withoutIdleSteps(mine), withoutIdleSteps(as_ours));
  EXPECT_TRUE(left.empty()) << where << ": " << left.size()
                            << " cells differ beyond the documented difference (" << expected->note
                            << (expected->match == Match::kOrderOnly ? "; idle steps dropped" : "")
                            << "):" << describe(left);
}

// Compares every file of one case.
void compareCase(const DumpedCase& c, const std::string& kind, ClassTally& tally) {
  ++tally.cases;
  Program compute;
  try {
    compute = generateSchedule(c.schedule, {c.p, c.v, c.m});
  } catch (const ScheduleError& e) {
    ADD_FAILURE() << c.label() << ": PyTorch builds this schedule, we reject it: " << e.what();
    return;
  }
  std::set<std::string> files;
  for (const auto& entry : c.files) files.insert(entry.first);
  for (const auto& entry : c.errors) files.insert(entry.first);
  for (const std::string& file : files) {
    ActionGrid mine;
    try {
      mine = ours(compute, file, isSingleStage(kind));
    } catch (const ScheduleError& e) {
      ADD_FAILURE() << c.label() << ", " << file << ": our lowering fails: " << e.what();
      continue;
    }
    if (auto it = c.files.find(file); it != c.files.end()) {
      compareFile(c, file, it->second, mine, tally);
      continue;
    }
    const std::string& error = c.errors.at(file);
    const ExpectedDifference* expected = expectedDifference(c.schedule, file);
    if (expected == nullptr || expected->match != Match::kPyTorchFails) {
      ADD_FAILURE() << c.label() << ", " << file << ": PyTorch fails to produce it (" << error
                    << ") and no documented difference says so";
      continue;
    }
    EXPECT_THAT(error, ::testing::HasSubstr(std::string(expected->pytorch_error)))
        << c.label() << ", " << file << " (" << expected->note << ")";
    tally.seen.insert(expected);
    ++tally.files_documented;
  }
}

const DumpedClass* findClass(const Dump& dump, std::string_view torch_class) {
  for (const auto& entry : dump.classes) {
    if (entry.torch_class == torch_class) return &entry;
  }
  return nullptr;
}

void compareClass(std::string_view torch_class) {
  Dump dump;
  PIPEFORGE_LOAD_DUMP_OR_SKIP(dump);
  const DumpedClass* entry = findClass(dump, torch_class);
  ASSERT_NE(entry, nullptr) << "torch " << dump.torch_version << " has no " << torch_class
                            << " (or the dump no longer lists it)";
  ClassTally tally;
  for (const auto& c : dump.cases) {
    if (c.torch_class == torch_class) compareCase(c, entry->kind, tally);
  }
  EXPECT_GT(tally.cases, 0) << "the dump holds no case of " << torch_class;
  for (const auto& expected : kExpectedDifferences) {
    if (expected.schedule != entry->schedule || tally.seen.count(&expected) > 0) continue;
    ADD_FAILURE() << "the documented difference of " << expected.schedule << " in the "
                  << expected.file << " file (" << expected.note << ") no longer occurs with torch "
                  << dump.torch_version << "; remove it from kExpectedDifferences and the Note";
  }
  std::printf("[ PyTorch  ] %s (torch %s): %d cases, %d files equal, %d documented differences\n",
              std::string(torch_class).c_str(), dump.torch_version.c_str(), tally.cases,
              tally.files_equal, tally.files_documented);
}

TEST(PyTorchOrders, GPipe) { compareClass("ScheduleGPipe"); }
TEST(PyTorchOrders, OneFOneB) { compareClass("Schedule1F1B"); }
TEST(PyTorchOrders, Interleaved1F1B) { compareClass("ScheduleInterleaved1F1B"); }
TEST(PyTorchOrders, LoopedBFS) { compareClass("ScheduleLoopedBFS"); }
TEST(PyTorchOrders, InterleavedZeroBubble) { compareClass("ScheduleInterleavedZeroBubble"); }
TEST(PyTorchOrders, ZBVZeroBubble) { compareClass("ScheduleZBVZeroBubble"); }
TEST(PyTorchOrders, DualPipeV) { compareClass("ScheduleDualPipeV"); }

// Every schedule class of the installed torch has a test above.
TEST(PyTorchOrders, EveryPyTorchClassIsCompared) {
  Dump dump;
  PIPEFORGE_LOAD_DUMP_OR_SKIP(dump);
  const std::set<std::string> tested = {
      "ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B", "ScheduleLoopedBFS",
      "ScheduleInterleavedZeroBubble", "ScheduleZBVZeroBubble", "ScheduleDualPipeV"};
  const std::vector<std::string> names = scheduleNames();
  for (const auto& entry : dump.classes) {
    EXPECT_NE(entry.kind, "unmapped")
        << "torch " << dump.torch_version << " has the schedule class " << entry.torch_class
        << ", which no Pipeforge generator reproduces; add one (schedules/gen_*.cpp), map it in "
        << "GENERATOR_FOR_CLASS of dump_pytorch_orders.py and add a test here, or list it in "
        << "NOT_COMPARED there with the reason";
    EXPECT_TRUE(tested.count(entry.torch_class) > 0)
        << entry.torch_class << " is dumped but has no TEST(PyTorchOrders, ...) here";
    if (entry.kind != "unmapped") {
      EXPECT_THAT(names, ::testing::Contains(entry.schedule))
          << entry.torch_class << " maps to '" << entry.schedule << "', not a generator name";
    }
  }
}

// The dump covers the whole matrix: p = 2..4; v = 1..3 (single-stage: 1);
// m in {p, 2p, 2pv, 3p+1}, each configuration once, built or rejected.
TEST(PyTorchOrders, DumpCoversTheMatrix) {
  Dump dump;
  PIPEFORGE_LOAD_DUMP_OR_SKIP(dump);
  using Key = std::tuple<std::string, int, int, int>;
  std::set<Key> expected;
  for (const auto& entry : dump.classes) {
    if (entry.kind == "unmapped") continue;
    for (int p = 2; p <= 4; ++p) {
      const int max_v = isSingleStage(entry.kind) ? 1 : 3;
      for (int v = 1; v <= max_v; ++v) {
        for (int m : {p, 2 * p, 2 * p * v, 3 * p + 1}) {
          expected.insert({entry.torch_class, p, v, m});
        }
      }
    }
  }
  std::set<Key> seen;
  for (const auto* list : {&dump.cases, &dump.rejected}) {
    for (const auto& c : *list) {
      Key key{c.torch_class, c.p, c.v, c.m};
      EXPECT_TRUE(seen.insert(key).second) << c.label() << " appears twice in the dump";
      EXPECT_TRUE(expected.count(key) > 0) << c.label() << " is outside the matrix";
    }
  }
  for (const auto& key : expected) {
    EXPECT_TRUE(seen.count(key) > 0)
        << std::get<0>(key) << " p=" << std::get<1>(key) << " v=" << std::get<2>(key)
        << " m=" << std::get<3>(key) << " is missing from the dump";
  }
}

// What PyTorch refuses to build, we refuse too.
TEST(PyTorchOrders, RejectedConfigurationsAgree) {
  Dump dump;
  PIPEFORGE_LOAD_DUMP_OR_SKIP(dump);
  EXPECT_FALSE(dump.rejected.empty());
  for (const auto& c : dump.rejected) {
    try {
      generateSchedule(c.schedule, {c.p, c.v, c.m});
      ADD_FAILURE() << c.label() << ": PyTorch rejects it (" << c.error << "), we build it";
    } catch (const ScheduleError& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(c.schedule + " rejects")) << c.label();
    }
  }
}

}  // namespace
}  // namespace pipeforge::schedules
