// `pipeforge inspect` as a user runs it (issue 24): the exit status, and the
// values in what it prints or writes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/inspect/svg_labels.h"
#include "tests/support/build_paths.h"
#include "tests/support/run_command.h"
#include "tests/support/zoo.h"

namespace pipeforge {
namespace {

namespace fs = std::filesystem;

class InspectCli : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::makeTempDir("pf-inspect-cli"); }
  void TearDown() override { fs::remove_all(dir_); }

  testing::CommandResult pipeforge(const std::string& args) {
    return testing::runCommand(std::string(PIPEFORGE_BINARY) + " " + args);
  }
  static std::string multiIo() {
    return "inspect '" + testing::zooModelPath("multi_io") + "' --spec '" + std::string(PIPEFORGE_SOURCE_DIR) +
           "/configs/split_multi_io.yaml'";
  }
  static std::string readFile(const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  std::string dir_;
};

TEST_F(InspectCli, TextShowsTheInputShapesAndWhatCrossesEachBoundary) {
  auto r = pipeforge(multiIo());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("def forward(self, x: \"float32[6, 8]\", y: \"float32[6, 8]\", mask: \"int64[6, 8]\"):"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("#   0|1  stage_0_0: float32[6, 8] (192 B)  (made by stage 0, last read by stage 2)\n"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("#   2|3  total 384 B\n"), std::string::npos) << r.output;
}

TEST_F(InspectCli, SvgLabelsCarryShapesAndDoNotCrowdEachOther) {
  const std::string out = dir_ + "/pipe.svg";
  auto r = pipeforge(multiIo() + " --format svg --out '" + out + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "") << "--out writes the file, not standard output";
  const auto boxes = testing::svgLabelBoxes(readFile(out));
  std::vector<std::string> inputs;
  for (const auto& b : boxes) {
    if (b.title.rfind("in_", 0) == 0) inputs.push_back(b.text);
  }
  EXPECT_EQ(inputs, (std::vector<std::string>{"x|float32[6, 8]|192 B", "y|float32[6, 8]|192 B",
                                              "mask|int64[6, 8]|384 B"}));
  const auto crowded = testing::crowdedLabels(boxes, 4.0);
  EXPECT_TRUE(crowded.empty()) << crowded.front();
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().filename(), "pipe.svg") << "written atomically: no temporary left behind";
  }
}

TEST_F(InspectCli, ADropoutPrintsAsDropoutWithItsRate) {
  auto r = pipeforge("inspect '" + testing::zooModelPath("gpt_dropout") + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("        (drop): Dropout("), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("p=0.2"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Module()"), std::string::npos) << r.output;
}

TEST_F(InspectCli, DepthDrawsOneNodePerModuleWithWhatCrossesEachCut) {
  // The README's line: the shipped inputs for the zoo's GPT.
  const std::string spec = std::string(PIPEFORGE_SOURCE_DIR) + "/configs/inspect_gpt.yaml";
  const std::string gpt = "inspect '" + testing::zooModelPath("gpt") + "' --spec '" + spec + "' --depth 1";
  auto r = pipeforge(gpt);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("at depth 1: 6 nodes"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  2|3  blocks.0: float32[4, 16, 16] (4096 B)  (made by node 2, last read by node 3)\n"),
            std::string::npos)
      << r.output;
  const std::string json = dir_ + "/modules.json";
  r = pipeforge(gpt + " --format json --out '" + json + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(readFile(json).find("\"module\": \"blocks.1\""), std::string::npos);
  EXPECT_NE(pipeforge("inspect --help").output.find("--depth"), std::string::npos);
}

TEST_F(InspectCli, ABadDepthSaysWhatIsWrongAndTheFix) {
  const std::string gpt = "inspect '" + testing::zooModelPath("gpt") + "'";
  auto r = pipeforge(gpt + " --depth 0");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("pipeforge inspect: error: --depth 0: the module view needs a depth of 1 or more (1: one "
                          "node per module forward calls itself"),
            std::string::npos)
      << r.output;
  r = pipeforge(gpt + " --depth 1 --stage 0");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--stage and --depth do not go together"), std::string::npos) << r.output;
  r = pipeforge(gpt + " --depth one");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--depth"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace pipeforge
