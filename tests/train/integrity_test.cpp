// Note [File digests] and the split-folder preflight, end to end: corrupt
// stage files and checkpoints are caught on load, a corrupt newest
// checkpoint falls back to the previous one, and a bogus tied group fails
// before any rank starts instead of aborting inside Gloo.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/xxh3.h"
#include "stage/file_digest.h"
#include "tests/support/zoo.h"
#include "tests/train/train_fixture.h"

namespace pipeforge::testing {
namespace {

namespace fs = std::filesystem;

std::string readText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Overwrites 16 bytes in the middle of the file (inside the tensor data).
void corrupt(const std::string& path) {
  std::string bytes = readText(path);
  ASSERT_GT(bytes.size(), 64u) << path;
  for (std::size_t k = 0; k < 16; ++k) bytes[bytes.size() / 2 + k] ^= 0x5a;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

RunSpec gptSpec() {
  RunSpec spec;
  spec.split = "num_stages: 2\n  policy: parameters";
  spec.steps = 2;
  spec.checkpoint_every = 1;
  spec.timeout_s = 30;
  return spec;
}

// A config that trains an existing split folder instead of splitting.
std::string configOnSplit(const TrainWorkspace& ws, const std::string& name, const std::string& split_dir) {
  const std::string path = ws.writeConfig(name, gptSpec());
  std::string text = readText(path);
  const std::string model = fmt::format("  path: {}\n  num_stages: 2\n  policy: parameters\n", zooModelPath("gpt"));
  auto at = text.find(model);
  EXPECT_NE(at, std::string::npos) << text;
  text.replace(at, model.size(), fmt::format("  split_dir: {}\n", split_dir));
  std::ofstream(path, std::ios::trunc) << text;
  return path;
}

std::string splitGpt(const TrainWorkspace& ws) {
  const std::string dir = ws.dir() + "/stages";
  const std::string spec = ws.dir() + "/spec.yaml";
  std::ofstream(spec) << "num_stages: 2\npolicy: parameters\n";
  auto r = runPipeforge(fmt::format("split '{}' --spec '{}' --out '{}'", zooModelPath("gpt"), spec, dir));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return dir;
}

TEST(Integrity, PipeJsonRecordsEveryStageFilesDigest) {
  TrainWorkspace ws;
  const std::string dir = splitGpt(ws);
  auto j = nlohmann::json::parse(readText(dir + "/pipe.json"));
  for (const auto& s : j["stages"]) {
    ASSERT_TRUE(s.contains("xxh3_128")) << s.dump();
    EXPECT_EQ(s["xxh3_128"].get<std::string>(), xxh3OfFile(dir + "/" + s["file"].get<std::string>()));
  }
}

// A split written before issue 41 records SHA-256 digests: still verified.
TEST(Integrity, AnOlderSplitsSha256IsStillVerified) {
  TrainWorkspace ws;
  const std::string dir = splitGpt(ws);
  auto j = nlohmann::json::parse(readText(dir + "/pipe.json"));
  for (auto& s : j["stages"]) {
    s.erase("xxh3_128");
    s["sha256"] = stage::sha256OfFile(dir + "/" + s["file"].get<std::string>());
  }
  std::ofstream(dir + "/pipe.json") << j.dump(2);
  corrupt(dir + "/stage_0.pt");
  auto run = runPipeforge(fmt::format("train --config '{}' --nproc 2", configOnSplit(ws, "old", dir)));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("stage_0.pt' is corrupt: its SHA-256 is"), std::string::npos) << run.output;
}

TEST(Integrity, ACorruptStageFileFailsBeforeAnyRankStarts) {
  TrainWorkspace ws;
  const std::string dir = splitGpt(ws);
  corrupt(dir + "/stage_1.pt");
  auto run = runPipeforge(fmt::format("train --config '{}' --nproc 2", configOnSplit(ws, "bad", dir)));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("stage_1.pt' is corrupt: its XXH3-128 digest is"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("rank 0"), std::string::npos) << "no rank should have started:\n" << run.output;
}

// The launcher compares the shapes pipe.json records (parameter_meta) without
// loading a stage file; a manifest written before parameter_meta has its
// stage files loaded instead. Both catch the bogus group.
class BogusTiedGroup : public ::testing::TestWithParam<bool> {};

TEST_P(BogusTiedGroup, FailsBeforeAnyRankStarts) {
  TrainWorkspace ws;
  const std::string dir = splitGpt(ws);
  auto j = nlohmann::json::parse(readText(dir + "/pipe.json"));
  for (const auto& stage : j["stages"]) {
    ASSERT_EQ(stage["parameter_meta"].size(), stage["parameters"].size()) << stage.dump();
  }
  EXPECT_EQ(j["stages"][0]["parameter_meta"][0].get<std::string>().rfind("float32[", 0), 0u);
  const bool older_manifest = GetParam();
  if (older_manifest) {
    for (auto& stage : j["stages"]) stage.erase("parameter_meta");
  }
  // Join two parameters of different shapes: the token embedding and the final norm's weight.
  j["tied"] = nlohmann::json::array({nlohmann::json::array({"wte.weight", "ln_f.weight"})});
  std::ofstream(dir + "/pipe.json", std::ios::trunc) << j.dump(1);
  auto run = runPipeforge(fmt::format("train --config '{}' --nproc 2", configOnSplit(ws, "tied", dir)));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("tied group [wte.weight, ln_f.weight] joins 'wte.weight' (float32[64, 16] in stage 0) "
                            "and 'ln_f.weight' (float32[16] in stage 1)"),
            std::string::npos)
      << run.output;
  EXPECT_EQ(run.output.find("signal"), std::string::npos) << run.output;
}

INSTANTIATE_TEST_SUITE_P(Integrity, BogusTiedGroup, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "OlderManifest" : "ParameterMeta"; });

TEST(Integrity, ACorruptNewestCheckpointFallsBackToThePreviousOne) {
  TrainWorkspace ws;
  RunSpec spec = gptSpec();
  const std::string config = ws.writeConfig("ckpt", spec);
  ASSERT_EQ(runPipeforge(fmt::format("train --config '{}' --nproc 2", config)).exit_code, 0);
  const std::string ckpt = ws.checkpointDir("ckpt");
  corrupt(ckpt + "/step_00000002/stage_0.pt");

  // Export names the corrupt file.
  auto ex = runPipeforge(fmt::format("export '{}' --model '{}' --out '{}/x.pt'", ckpt, zooModelPath("gpt"), ws.dir()));
  EXPECT_EQ(ex.exit_code, 1) << ex.output;
  EXPECT_NE(ex.output.find("step_00000002/stage_0.pt' is corrupt"), std::string::npos) << ex.output;

  // Resuming to step 3 warns, names both, and starts from step 1.
  spec.steps = 3;
  const std::string more = ws.writeConfig("ckpt", spec);
  auto run = runPipeforge(fmt::format("train --config '{}' --nproc 2", more));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("step_00000002/stage_0.pt' is corrupt"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("resuming from '" + ckpt + "/step_00000001' instead"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("resumed from " + ckpt + "/step_00000001 at step 1"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace pipeforge::testing
