// Note [Reduced precision on Gloo]: a bfloat16 model whose tied weights sit
// on two ranks trains over Gloo (whose allreduce has no bfloat16 kernel).
#include <gtest/gtest.h>

#include <torch/script.h>

#include <fmt/format.h>

#include "tests/support/zoo.h"
#include "tests/train/train_fixture.h"

namespace pipeforge::testing {
namespace {

TEST(Precision, Bfloat16WithTiedWeightsTrainsOverGloo) {
  TrainWorkspace ws;
  auto model = torch::jit::load(zooModelPath("gpt"));
  model.to(at::kBFloat16);
  const std::string path = ws.dir() + "/gpt_bf16.pt";
  model.save(path);
  RunSpec spec;
  spec.model_path = path;
  spec.split = "num_stages: 2\n  policy: parameters";  // wte on stage 0, the tied lm_head on stage 1
  spec.steps = 2;
  spec.optimizer = "{name: sgd, lr: 0.05}";
  auto run = runPipeforge(fmt::format("train --config '{}' --nproc 2", ws.writeConfig("bf16", spec)));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  auto trained = exportedParameters(ws.checkpointDir("bf16"), path, ws.dir() + "/trained.pt");
  EXPECT_EQ(trained.at("wte.weight").scalar_type(), at::kBFloat16);
  EXPECT_FALSE(at::equal(trained.at("wte.weight"), model.attr("wte").toModule().attr("weight").toTensor()))
      << "training changed nothing";
  EXPECT_TRUE(at::isfinite(trained.at("wte.weight")).all().item<bool>());
}

}  // namespace
}  // namespace pipeforge::testing
