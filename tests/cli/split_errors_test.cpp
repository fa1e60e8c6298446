// Every bad input to `pipeforge split` gets a clear message, a non-zero exit,
// no crash and no output folder.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/support/build_paths.h"
#include "tests/support/run_command.h"
#include "tests/support/zoo.h"

namespace pipeforge {
namespace {

namespace fs = std::filesystem;

class SplitErrors : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::makeTempDir("pf-split-errors"); }
  void TearDown() override { fs::remove_all(dir_); }

  std::string writeFile(const std::string& name, const std::string& text) {
    std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }

  // Runs split and checks: exit 1, the message contains every `expected`
  // fragment, no abort, and no output folder.
  void expectFailure(const std::string& model, const std::string& spec_text,
                     const std::vector<std::string>& expected) {
    std::string out = dir_ + "/out";
    std::string cmd = std::string(PIPEFORGE_BINARY) + " split '" + model + "' --out '" + out + "'";
    if (!spec_text.empty()) cmd += " --spec '" + writeFile("spec.yaml", spec_text) + "'";
    auto result = testing::runCommand(cmd);
    EXPECT_EQ(result.exit_code, 1) << result.output;
    for (const auto& fragment : expected) {
      EXPECT_NE(result.output.find(fragment), std::string::npos) << "missing '" << fragment << "' in:\n" << result.output;
    }
    EXPECT_EQ(result.output.find("terminate called"), std::string::npos) << result.output;
    EXPECT_EQ(result.output.find("INTERNAL ASSERT"), std::string::npos) << result.output;
    EXPECT_FALSE(fs::exists(out)) << "a failed split must leave no output folder";
    for (const auto& e : fs::directory_iterator(dir_)) {
      EXPECT_EQ(e.path().filename().string().find("out.tmp"), std::string::npos) << "temporary left: " << e.path();
    }
  }

  std::string dir_;
};

TEST_F(SplitErrors, MissingModelFile) {
  expectFailure(dir_ + "/nope.pt", "split_points: {a: END}", {"does not exist"});
}

TEST_F(SplitErrors, NotATorchScriptArchive) {
  expectFailure(writeFile("text.pt", "hello, I am not a model\n"), "split_points: {a: END}",
                {"neither a torch.export archive (.pt2) nor a TorchScript archive", "torch.export.save("});
}

TEST_F(SplitErrors, TruncatedArchive) {
  std::ifstream in(testing::zooModelPath("seed_example"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string path = writeFile("truncated.pt", bytes.substr(0, bytes.size() / 2));
  expectFailure(path, "split_points: {layers.1: BEGINNING}", {"cannot load TorchScript archive", "truncated"});
}

TEST_F(SplitErrors, UnknownFqnSuggestsNearMatches) {
  expectFailure(testing::zooModelPath("seed_example"), "split_points: {layers.12: BEGINNING}",
                {"'layers.12'", "no submodule", "nearest: layers.1"});
}

TEST_F(SplitErrors, SplitPointInsideLoopBody) {
  expectFailure(testing::zooModelPath("loop_model"), "split_points: {block: BEGINNING}", {"'block'", "loop"});
}

TEST_F(SplitErrors, SpecYieldingAnEmptyStage) {
  expectFailure(testing::zooModelPath("seed_example"), "split_points: {emb: BEGINNING}", {"empty stage 0"});
  expectFailure(testing::zooModelPath("seed_example"), "split_points: {lm: END}", {"empty last stage"});
}

TEST_F(SplitErrors, MoreStagesThanCutPoints) {
  expectFailure(testing::zooModelPath("seed_example"), "num_stages: 8\npolicy: uniform",
                {"8 stages asked for", "at most 4 stages"});
}

TEST_F(SplitErrors, MalformedYaml) {
  expectFailure(testing::zooModelPath("seed_example"), "split_points: {layers.1: BEGINNING\n  - [",
                {":1: '{' is never closed; close it with '}'"});
}

// Note [Index ranges of example inputs]: a `high` past the vocabulary is
// named as such, with the embedding the input indexes (wte, 64 rows; not wpe,
// the smaller one it does not index).
TEST_F(SplitErrors, ExampleInputsBeyondTheVocabulary) {
  expectFailure(testing::zooModelPath("gpt"),
                "num_stages: 2\nexample_inputs:\n  - {shape: [2, 8], dtype: int64, high: 100000}",
                {"index out of range",
                 "example_inputs[0] draws integers in [0, 100000), but it indexes embedding 'wte', which has 64 rows "
                 "(indices 0..63); set example_inputs[0].high to at most 64"});
}

TEST_F(SplitErrors, UnknownPolicyAndSplitPointAndKey) {
  expectFailure(testing::zooModelPath("mlp"), "num_stages: 2\npolicy: fastest", {"unknown policy 'fastest'"});
  expectFailure(testing::zooModelPath("mlp"), "split_points: {blocks.1: MIDDLE}", {"'MIDDLE'", "BEGINNING or END"});
  expectFailure(testing::zooModelPath("mlp"), "num_stage: 2", {"unknown key 'num_stage'"});
}

TEST_F(SplitErrors, ExampleInputsThatDoNotFit) {
  expectFailure(testing::zooModelPath("mlp"), "num_stages: 2\npolicy: cost\nexample_inputs: [{shape: [8, 5]}]",
                {"example_inputs do not fit the model"});
  expectFailure(testing::zooModelPath("mlp"),
                "num_stages: 2\npolicy: cost\nexample_inputs: [{shape: [8, 8]}, {shape: [1]}]",
                {"example_inputs has 2 entries but forward takes 1"});
}

TEST_F(SplitErrors, NoSplitAtAll) {
  expectFailure(testing::zooModelPath("mlp"), "", {"gives no split"});
}

TEST(Cli, UnknownSubcommandAndFlagExitWithTwo) {
  auto sub = testing::runCommand(std::string(PIPEFORGE_BINARY) + " frobnicate");
  EXPECT_EQ(sub.exit_code, 2) << sub.output;
  EXPECT_NE(sub.output.find("frobnicate"), std::string::npos) << sub.output;
  auto flag = testing::runCommand(std::string(PIPEFORGE_BINARY) + " split --bogus-flag x.pt --out y");
  EXPECT_EQ(flag.exit_code, 2) << flag.output;
  EXPECT_NE(flag.output.find("--bogus-flag"), std::string::npos) << flag.output;
}

TEST(Cli, HelpExplainsEverySubcommand) {
  auto top = testing::runCommand(std::string(PIPEFORGE_BINARY) + " --help");
  EXPECT_EQ(top.exit_code, 0);
  for (const char* sub : {"split", "inspect", "schedule", "train", "export"}) {
    EXPECT_NE(top.output.find(sub), std::string::npos) << sub;
    auto help = testing::runCommand(std::string(PIPEFORGE_BINARY) + " " + sub + " --help");
    EXPECT_EQ(help.exit_code, 0) << sub << ": " << help.output;
    EXPECT_NE(help.output.find("Usage"), std::string::npos) << sub;
  }
}

TEST(Cli, VersionNamesTheLibTorchOfTheZoosPython) {
  auto v = testing::runCommand(std::string(PIPEFORGE_BINARY) + " --version");
  EXPECT_EQ(v.exit_code, 0) << v.output;
  // major.minor of the torch that PIPEFORGE_PYTHON imports (the headers may say x.y.0 for x.y.1).
  std::string python = PIPEFORGE_PYTHON_TORCH_VERSION;
  std::string major_minor = python.substr(0, python.find('.', python.find('.') + 1));
  EXPECT_NE(v.output.find("pipeforge 0.1.0 (LibTorch " + major_minor + "."), std::string::npos)
      << v.output << " (the zoo's Python has torch " << python << ")";
}

}  // namespace
}  // namespace pipeforge
