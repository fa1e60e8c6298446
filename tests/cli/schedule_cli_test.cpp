// `pipeforge schedule` end to end: golden interop, files written, bad input refused.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/support/build_paths.h"
#include "tests/support/run_command.h"
#include "tests/support/zoo.h"

namespace pipeforge {
namespace {

std::string pf() { return PIPEFORGE_BINARY; }
std::string golden(const std::string& name) { return std::string(PIPEFORGE_SOURCE_DIR) + "/tests/schedules/golden/" + name; }

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(ScheduleCli, GoldenZb1pLowersAndSimulatesIn113Steps) {
  auto r = testing::runCommand(pf() + " schedule --load " + golden("zb1p_2rank_2stagep_compute.csv") +
                               " --format compute_only --lower --simulate");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("unit-time simulation: 113 steps"), std::string::npos) << r.output;
}

TEST(ScheduleCli, DualPipeVCsvEqualsPyTorchsByteForByte) {
  std::string dir = testing::makeTempDir("pf-sched");
  auto r = testing::runCommand(pf() + " schedule --name dualpipev --ranks 4 --stages 8 --microbatches 10 --csv " + dir +
                               "/out.csv");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(readFile(dir + "/out.csv"), readFile(golden("dualpipev_4rank_10mb.csv")));
  std::filesystem::remove_all(dir);
}

// Megatron's docstring example, PP2 N3M5 VP2: rank 0 runs chunk c's
// microbatches in groups of 3 (1 1 1 2 2 2 -2 1 -2 1 -2 2 -1 2 -1 -1 -2 -2 -1 -1).
TEST(ScheduleCli, MicrobatchGroupSizeIsMegatrons) {
  std::string dir = testing::makeTempDir("pf-sched");
  auto r = testing::runCommand(pf() + " schedule --name MegatronInterleaved --ranks 2 --stages 4 --microbatches 5 "
                                      "--microbatch-group-size 3 --csv " + dir + "/out.csv");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string csv = readFile(dir + "/out.csv");
  std::string rank0 = csv.substr(0, csv.find('\n'));
  std::string order;
  for (std::size_t at = 0; at <= rank0.size();) {
    const std::size_t comma = std::min(rank0.find(',', at), rank0.size());
    if (comma > at) order += (order.empty() ? "" : " ") + rank0.substr(at, comma - at);
    at = comma + 1;
  }
  EXPECT_EQ(order, "0F0 0F1 0F2 2F0 2F1 2F2 2B0 0F3 2B1 0F4 2B2 2F3 0B0 2F4 0B1 0B2 2B3 2B4 0B3 0B4") << csv;
  auto other = testing::runCommand(pf() + " schedule --name 1F1B --ranks 2 --stages 2 --microbatches 4 "
                                          "--microbatch-group-size 3");
  EXPECT_EQ(other.exit_code, 2) << other.output;
  EXPECT_NE(other.output.find("--microbatch-group-size applies to MegatronInterleaved only, not 1F1B"),
            std::string::npos)
      << other.output;
  std::filesystem::remove_all(dir);
}

TEST(ScheduleCli, WritesTraceAndSvgWithCosts) {
  std::string dir = testing::makeTempDir("pf-sched");
  auto r = testing::runCommand(pf() + " schedule --name ZBVZeroBubble --ranks 2 --stages 4 --microbatches 4 "
                                      "--costs 1,1,1,0.1 --simulate --trace " + dir + "/t.json --svg " + dir + "/t.svg");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("makespan"), std::string::npos) << r.output;
  auto trace = nlohmann::json::parse(readFile(dir + "/t.json"));
  int compute_events = 0;
  for (const auto& e : trace["traceEvents"]) compute_events += e.value("ph", "") == "X";
  // 4 stages x 4 microbatches x (F, I, W).
  EXPECT_EQ(compute_events, 48);
  EXPECT_NE(readFile(dir + "/t.svg").find("<svg"), std::string::npos);
  std::filesystem::remove_all(dir);
}

// The grid counts each rank's actions; the unit-time simulation counts steps
// of the lowered schedule. The output says which is which and explains cells.
TEST(ScheduleCli, GridAndUnitSimulationSayWhatTheyCount) {
  auto r = testing::runCommand(pf() + " schedule --name ZBVZeroBubble --ranks 4 --stages 8 --microbatches 8 --simulate");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const std::string expected : {
           "step grid (each rank's actions in list order; a blank cell: the rank idles that step):\n",
           "Step 50:                         3W7    \n",
           "cells: <stage><action><microbatch>, e.g. 0F1 = stage 0, action F, microbatch 1\n"
           "  F  forward\n"
           "  I  backward, input gradient only (sent to the previous stage)\n"
           "  W  backward, weight gradient only (may wait, to fill idle time)\n",
           "unit-time simulation: 124 steps, of the schedule lowered to SEND/RECV",
           "  in each step a rank runs one action, compute or SEND/RECV, or waits for an input;\n"
           "  the grid above has 51 rows: compute actions only, without SEND/RECV or waits\n",
       }) {
    EXPECT_NE(r.output.find(expected), std::string::npos) << "missing:\n" << expected << "\nin:\n" << r.output;
  }
}

TEST(ScheduleCli, LoweredGridLegendNamesMessages) {
  auto r = testing::runCommand(pf() + " schedule --name 1F1B --ranks 2 --stages 2 --microbatches 2 --lower --simulate");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("  SEND_F  send the forward output to the next stage\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the grid above has"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rows: the same actions, without waits\n"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("lowered to SEND/RECV"), std::string::npos) << r.output;
}

TEST(ScheduleCli, AutoNamesTheMemoryLimitOnlyWhenThereIsOne) {
  const std::string auto_cmd = pf() + " schedule --name auto --ranks 4 --stages 8 --microbatches 8 --costs 1,1.3,0.7,0.1";
  auto unlimited = testing::runCommand(auto_cmd);
  EXPECT_EQ(unlimited.exit_code, 0) << unlimited.output;
  EXPECT_NE(unlimited.output.find("      best named schedule: "), std::string::npos) << unlimited.output;
  EXPECT_EQ(unlimited.output.find("limit"), std::string::npos) << unlimited.output;

  auto limited = testing::runCommand(auto_cmd + " --mem-limit 12");
  EXPECT_EQ(limited.exit_code, 0) << limited.output;
  EXPECT_NE(limited.output.find("      best named schedule within --mem-limit 12: "), std::string::npos)
      << limited.output;
}

TEST(ScheduleCli, PeakMemoryHasAUnit) {
  struct Case {
    std::string args;
    std::string expected;
  };
  const std::string zbv = " --name ZBVZeroBubble --ranks 2 --stages 4 --microbatches 4 --costs 1,1,1 --simulate";
  const std::vector<Case> cases = {
      {zbv, "  peak memory     per rank 4, 4 microbatch activations (1 = one microbatch's activations on one stage)\n"},
      {zbv + " --act-mem 2.5", "  peak memory     per rank 10, 10 in the unit of --act-mem (one microbatch on one stage = 2.5)\n"},
      {zbv + " --act-mem 512MiB", "  peak memory     per rank 2 GiB, 2 GiB\n"},
      {zbv + " --act-mem 512MiB --mem-limit 8GiB", "  peak memory     per rank 2 GiB, 2 GiB\n"},
  };
  for (const auto& c : cases) {
    auto r = testing::runCommand(pf() + " schedule" + c.args);
    EXPECT_EQ(r.exit_code, 0) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.expected), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find("  makespan        "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(" (in the unit of the costs)\n"), std::string::npos) << r.output;
  }
}

TEST(ScheduleCli, MemoryLimitAboveThePeakNamesBothInBytes) {
  auto r = testing::runCommand(pf() + " schedule --name GPipe --ranks 2 --stages 2 --microbatches 8 --costs 1,1,1 "
                                      "--act-mem 1GiB --mem-limit 4GiB");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("the schedule peaks at 8 GiB of activation memory on rank 0, above --mem-limit 4 GiB"),
            std::string::npos)
      << r.output;
}

TEST(ScheduleCli, BadInputIsAClearErrorWithNonZeroExit) {
  struct Case {
    std::string args;
    int exit_code;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {"--name nope --ranks 2 --stages 2 --microbatches 2", 2, "unknown schedule 'nope'"},
      {"--name 1F1B --ranks 4 --stages 6 --microbatches 4", 2, "not a multiple of --ranks"},
      {"--name ZBVZeroBubble --ranks 2 --stages 6 --microbatches 4", 1, "2 stages per rank"},
      {"--load /etc/hostname --format compute_only", 1, "expected <stage><TYPE>[<microbatch>]"},
      {"--load /nonexistent.csv --format compute_only", 1, "/nonexistent.csv"},
      {"--name auto --ranks 2 --stages 2 --microbatches 2 --mem-limit 8GiB", 2,
       "--mem-limit 8GiB is a size in bytes, so the simulator needs the activation memory in bytes too"},
      {"--name auto --ranks 2 --stages 2 --microbatches 2 --act-mem 1GiB --mem-limit 8", 2,
       "--act-mem 1GiB is in bytes, but --mem-limit 8 has no unit"},
      {"--name auto --ranks 2 --stages 2 --microbatches 2 --act-mem lots", 2, "--act-mem lots: expected a positive"},
  };
  for (const auto& c : cases) {
    auto r = testing::runCommand(pf() + " schedule " + c.args);
    EXPECT_EQ(r.exit_code, c.exit_code) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.fragment), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace pipeforge
