// `pipeforge` exits with the status of its error's code (README "Exit
// statuses"): 1 for a bad spec, 2 for a bad command line, 3 when the file
// system refuses a write. Peer failures (4) and internal errors (70) cannot be
// caused from outside on purpose: run_guarded_test.cpp and the launcher's
// tests cover them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/support/build_paths.h"
#include "tests/support/run_command.h"
#include "tests/support/zoo.h"

namespace pipeforge {
namespace {

namespace fs = std::filesystem;

class CliExitStatus : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::makeTempDir("pf-exit-status"); }
  void TearDown() override { fs::remove_all(dir_); }

  std::string writeFile(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  testing::CommandResult pipeforge(const std::string& args) {
    return testing::runCommand(std::string(PIPEFORGE_BINARY) + " " + args);
  }

  std::string dir_;
};

TEST_F(CliExitStatus, BadSpecIsUserInput) {
  const std::string spec = writeFile("spec.yaml", "split_points: {layers.12: BEGINNING}\n");
  auto r = pipeforge("split '" + testing::zooModelPath("seed_example") + "' --spec '" + spec + "' --out '" + dir_ +
                     "/out'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("no submodule"), std::string::npos) << r.output;
}

TEST_F(CliExitStatus, BadCommandLineIsUsage) {
  auto r = pipeforge("split --no-such-flag");
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

TEST_F(CliExitStatus, OutputUnderAFileIsIo) {
  // The parent of --out is a file: creating it fails in the file system.
  const std::string file = writeFile("a_file", "not a folder\n");
  auto r = pipeforge("split '" + testing::zooModelPath("seed_example") + "' --spec '" +
                     writeFile("spec.yaml", "split_points: {layers.1: BEGINNING}\n") + "' --out '" + file + "/out'");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("pipeforge split: error: cannot create the parent of output folder"), std::string::npos)
      << r.output;
}

TEST_F(CliExitStatus, UnwritableScheduleCsvIsIo) {
  auto r = pipeforge("schedule --name 1F1B --ranks 2 --stages 2 --microbatches 4 --csv '" + dir_ +
                     "/no/such/folder/s.csv'");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("cannot write the"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace pipeforge
