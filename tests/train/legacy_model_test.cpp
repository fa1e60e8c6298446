// Note [Legacy zoo]: a TorchScript file saved by an older torch (1.13, by
// Debian's /usr/bin/python3) still loads, computes what it computed there,
// splits and trains to the parameters single-process training reaches, on
// the LibTorch we link (2.13 in the main build).
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>

#include "tests/support/build_paths.h"
#include "tests/support/zoo.h"
#include "tests/train/train_fixture.h"

namespace pipeforge::testing {
namespace {

std::string legacyZoo() { return PIPEFORGE_LEGACY_ZOO_DIR; }

#define SKIP_WITHOUT_LEGACY_ZOO()                                                                      \
  if (legacyZoo().empty())                                                                             \
  GTEST_SKIP() << "no older torch to save a legacy zoo with (the system build, or /usr/bin/python3 " \
                  "without torch): Note [Legacy zoo]"

TEST(LegacyTorchScript, ComputesWhatTheOlderTorchComputed) {
  SKIP_WITHOUT_LEGACY_ZOO();
  for (const std::string name : {"gpt", "mlp"}) {
    auto holder = torch::jit::load(legacyZoo() + "/" + name + ".ref.pt");
    std::vector<torch::jit::IValue> inputs;
    for (const c10::IValue v : holder.attr("inputs").toList()) inputs.push_back(v);
    auto expected = holder.attr("outputs").toList().get(0).toTensor();
    auto model = torch::jit::load(legacyZoo() + "/" + name + ".pt");
    model.eval();
    auto got = runForward(model, inputs).at(0);
    // Kernels may round differently across releases; the graph must not.
    EXPECT_TRUE(at::allclose(got, expected, 1e-5, 1e-6))
        << name << ": max abs diff " << (got - expected).abs().max().item<double>() << " from torch "
        << PIPEFORGE_LEGACY_TORCH_VERSION;
  }
}

TEST(LegacyTorchScript, SplitsAndTrainsAsSingleProcess) {
  SKIP_WITHOUT_LEGACY_ZOO();
  TrainWorkspace ws;
  RunSpec spec;
  spec.model = "gpt";
  spec.model_path = legacyZoo() + "/gpt.pt";
  spec.split = "num_stages: 2\n  policy: parameters";
  spec.optimizer = "{name: adamw, lr: 1.0e-3, weight_decay: 0.01, eps: 1.0e-6}";  // eps: see equivalence_test.cpp
  const std::string config = ws.writeConfig("legacy", spec);
  auto run = runPipeforge(fmt::format("train --config '{}' --nproc 2", config));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  auto trained = exportedParameters(ws.checkpointDir("legacy"), spec.model_path, ws.dir() + "/trained.pt");
  auto expected = trainReference(train::loadTrainConfig(config));
  auto bad = mismatches(trained, expected, 1e-5, 4e-5);
  EXPECT_TRUE(bad.empty()) << fmt::format("{}", fmt::join(bad, "\n")) << "\n" << run.output;
  EXPECT_EQ(trained.size(), expected.size());
}

}  // namespace
}  // namespace pipeforge::testing
