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
