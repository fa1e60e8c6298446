// Note [Non-finite steps]: a NaN/inf loss or gradient stops the run naming
// the step and the first stage (on_nonfinite: stop) or drops that update on
// every rank (skip_step); an update that overflows stops the run under either
// policy, before any checkpoint holds it, so rotation keeps a finite one.
#include <gtest/gtest.h>

#include <torch/script.h>
#include <torch/serialize.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <fmt/format.h>

#include "tests/support/zoo.h"
#include "tests/train/train_fixture.h"

namespace pipeforge::testing {
namespace {

namespace fs = std::filesystem;

// Replaces the workspace's mlp data with inputs that are NaN in every row.
void poisonMlpData(const TrainWorkspace& ws) {
  at::Tensor x = at::full({256, 8}, std::numeric_limits<float>::quiet_NaN());
  at::Tensor y = at::zeros({256, 4});
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("inputs", x);
  dict.insert("targets", y);
  auto bytes = torch::pickle_save(dict);
  std::ofstream(ws.dir() + "/mlp.pt", std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

RunSpec mlpSpec() {
  RunSpec spec;
  spec.model = "mlp";
  spec.split = "num_stages: 2\n  policy: parameters";
  spec.optimizer = "{name: sgd, lr: 0.05}";
  spec.steps = 3;
  spec.microbatches = 2;
  spec.checkpoint_every = 1;
  spec.timeout_s = 30;
  return spec;
}

std::string withPolicy(const std::string& config_path, const std::string& policy) {
  std::ifstream in(config_path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  const std::string key = "training: {";
  auto at = text.find(key);
  text.insert(at + key.size(), fmt::format("on_nonfinite: {}, ", policy));
  std::ofstream(config_path) << text;
  return config_path;
}

TEST(NonFinite, StopNamesTheStepAndTheFirstStage) {
  TrainWorkspace ws;
  poisonMlpData(ws);
  const std::string config = withPolicy(ws.writeConfig("stop", mlpSpec()), "stop");
  auto run = runPipeforge(fmt::format("train --config '{}' --nproc 2", config));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("training step 1 of 3"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("the loss is not finite"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("first non-finite at stage 0"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("on_nonfinite: skip_step"), std::string::npos) << run.output;
  EXPECT_FALSE(fs::exists(ws.checkpointDir("stop") + "/latest")) << "no checkpoint of a non-finite step";
}

TEST(NonFinite, SkipStepDropsEveryUpdateOnEveryRank) {
  TrainWorkspace ws;
  poisonMlpData(ws);
  const std::string config = withPolicy(ws.writeConfig("skip", mlpSpec()), "skip_step");
  auto run = runPipeforge(fmt::format("train --config '{}' --nproc 2", config));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("3 updates skipped (non-finite)"), std::string::npos) << run.output;
  std::ifstream metrics(ws.outDir("skip") + "/metrics.jsonl");
  int skipped = 0;
  for (std::string line; std::getline(metrics, line);) skipped += line.find("\"skipped_step\"") != std::string::npos;
  EXPECT_EQ(skipped, 3);
  // No update reached any stage: the trained model is the original one.
  auto trained = exportedParameters(ws.checkpointDir("skip"), zooModelPath("mlp"), ws.dir() + "/trained.pt");
  auto original = torch::jit::load(zooModelPath("mlp"));
  for (const auto& p : original.named_parameters()) {
    EXPECT_TRUE(at::equal(p.value, trained.at(p.name))) << p.name << " changed although every update was skipped";
  }
}

TEST(NonFinite, AnExplodingRunStopsAndEveryKeptCheckpointIsFinite) {
  TrainWorkspace ws;
  RunSpec spec = mlpSpec();
  spec.steps = 2;
  const std::string sane = ws.writeConfig("rot", spec);
  ASSERT_EQ(runPipeforge(fmt::format("train --config '{}' --nproc 2", sane)).exit_code, 0);
  // Resume with an update that overflows float: lr ~2.6e38 times (grad + 10 * weight) is
  // beyond float's 3.4e38 wherever |grad + 10 * weight| > 1.3 (the weights are ~0.3).
  spec.steps = 5;
  spec.optimizer = "{name: sgd, lr: 3.0e38, weight_decay: 10.0}";
  std::string wild = ws.writeConfig("rot", spec);
  {
    std::ifstream in(wild);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    text.replace(text.find("checkpoint: {"), std::string("checkpoint: {").size(), "checkpoint: {keep: 1, ");
    std::ofstream(wild) << text;
  }
  auto run = runPipeforge(fmt::format("train --config '{}' --nproc 2", wild));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  // Step 3's update either overflows at once or leaves weights so large that
  // step 4's loss is not finite; either way the run stops there. Step 3's
  // parameter check rides on step 4's collective (Note [One collective per
  // step's checks]) unless a checkpoint is due after step 3, when it is
  // settled at once: either way it names step 3's update.
  const bool overflowed =
      run.output.find("of 5: the update of step 3 made the parameters of stage") != std::string::npos;
  const bool nan_loss = run.output.find("training step 4 of 5: the loss is not finite") != std::string::npos;
  EXPECT_TRUE(overflowed || nan_loss) << run.output;
  EXPECT_FALSE(fs::exists(ws.checkpointDir("rot") + "/step_00000004")) << run.output;
  // keep: 1 rotated away older folders, but what is left is finite.
  auto kept = exportedParameters(ws.checkpointDir("rot"), zooModelPath("mlp"), ws.dir() + "/kept.pt");
  ASSERT_FALSE(kept.empty());
  for (const auto& [name, value] : kept) EXPECT_TRUE(at::isfinite(value).all().item<bool>()) << name;
}

}  // namespace
}  // namespace pipeforge::testing
