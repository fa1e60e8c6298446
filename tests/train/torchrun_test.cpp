// The README's cluster command, run for real: torchrun (from the build's
// Python) starts `pipeforge train` as its workers. torchrun's agent already
// serves the store at MASTER_ADDR:MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE),
// so rank 0 must connect to it rather than serve a second one there.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tests/support/build_paths.h"
#include "tests/support/zoo.h"
#include "tests/train/train_fixture.h"

namespace pipeforge::testing {
namespace {

TEST(Torchrun, TrainsAsTheReadmeSays) {
  if (std::string why = torchrunUnusable(); !why.empty()) {
    GTEST_SKIP() << PIPEFORGE_PYTHON << " -m torch.distributed.run cannot start even /bin/true: " << why;
  }
  TrainWorkspace ws;
  RunSpec spec;
  spec.split = "num_stages: 2\n  policy: parameters";
  spec.steps = 3;
  spec.optimizer = "{name: adamw, lr: 1.0e-3, weight_decay: 0.01, eps: 1.0e-6}";  // eps: see equivalence_test.cpp
  const std::string config = ws.writeConfig("torchrun", spec);
  // `--no_python` is the spelling both torch 1.13 and 2.x accept (2.x also takes --no-python).
  auto run = runCommand(fmt::format("'{}' -m torch.distributed.run --standalone --nproc_per_node 2 --no_python '{}' "
                                    "train --config '{}' 2>&1",
                                    PIPEFORGE_PYTHON, PIPEFORGE_BINARY, config));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(run.output.find("Address already in use"), std::string::npos) << run.output;
  // The same training as our own launcher gives: the same parameters after 3 steps.
  auto trained = exportedParameters(ws.checkpointDir("torchrun"), zooModelPath("gpt"), ws.dir() + "/trained.pt");
  auto expected = trainReference(train::loadTrainConfig(config));
  auto bad = mismatches(trained, expected, 1e-5, 4e-5);
  EXPECT_TRUE(bad.empty()) << fmt::format("{}", fmt::join(bad, "\n")) << "\n" << run.output;
}

}  // namespace
}  // namespace pipeforge::testing
