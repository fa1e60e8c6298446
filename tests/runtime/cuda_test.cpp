// The CUDA specifics, built only against a LibTorch with CUDA. The first two
// tests run everywhere that build runs (CI's CUDA configuration, on CPU):
// they prove CUDA and NCCL really were compiled in. The others need a GPU
// and skip without one; scripts/gpu_check.sh runs them on a lent device.
#include <gtest/gtest.h>
#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/script.h>

#include <iostream>

#include "compat/cuda_device.h"
#include "runtime/c10d_comm.h"
#include "runtime/rng_state.h"
#include "tests/runtime/runner_fixture.h"

namespace pipeforge::runtime {
namespace {

#define PF_NEED_GPU()                                                      \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device here"

// The training tests run on cuda:0 where there is a GPU, and on the CPU
// elsewhere, so their logic is checked on every run of this build.
std::string trainingDevice() { return torch::cuda::is_available() ? "cuda:0" : "cpu"; }

TEST(CudaBuildTest, CudaAndNcclAreCompiledIn) {
  EXPECT_TRUE(compat::builtWithCuda());
  EXPECT_TRUE(c10dHasNccl());
}

TEST(CudaBuildTest, ACpuDeviceReportsNoGpuFigures) {
  EXPECT_FALSE(compat::maxMemoryAllocated("cpu").has_value());
  compat::HostSyncCounter counter;
  at::Tensor t = torch::ones({4});
  EXPECT_EQ(t.sum().item<float>(), 4.0f);  // a CPU read synchronises nothing
  EXPECT_EQ(counter.count(), 0);
}

TEST(CudaTest, PeakMemoryIsTheAllocatorsPeak) {
  PF_NEED_GPU();
  compat::resetPeakMemory("cuda:0");
  const std::int64_t before = *compat::maxMemoryAllocated("cuda:0");
  {
    at::Tensor big = torch::empty({64 << 20}, torch::TensorOptions().dtype(torch::kUInt8).device("cuda:0"));
    EXPECT_GE(*compat::maxMemoryAllocated("cuda:0"), before + (64 << 20));
  }
  compat::resetPeakMemory("cuda:0");
  EXPECT_LT(*compat::maxMemoryAllocated("cuda:0"), before + (64 << 20));
}

TEST(CudaTest, HostSyncsAreCounted) {
  PF_NEED_GPU();
  at::Tensor t = torch::ones({4}, torch::TensorOptions().device("cuda:0"));
  compat::HostSyncCounter counter;
  EXPECT_EQ(counter.count(), 0);
  EXPECT_EQ(t.sum().item<float>(), 4.0f);  // a device-to-host read
  EXPECT_EQ(counter.count(), 1);
}

TEST(CudaTest, TheDeviceGeneratorIsCapturedAndRestored) {
  PF_NEED_GPU();
  const RngState at_start = captureRng("cuda:0");
  ASSERT_TRUE(at_start.device.defined());
  at::Tensor first = torch::rand({16}, torch::TensorOptions().device("cuda:0"));
  restoreRng("cuda:0", at_start);
  at::Tensor again = torch::rand({16}, torch::TensorOptions().device("cuda:0"));
  EXPECT_TRUE(torch::equal(first, again));
  at::Tensor next = torch::rand({16}, torch::TensorOptions().device("cuda:0"));
  EXPECT_FALSE(torch::equal(first, next));
}

// Two in-process ranks on cuda:0 train the two-stage mlp: its losses and
// gradients are the CPU reference's.
TEST(CudaTest, StagesOnTheGpuMatchTheCpuReference) {
  const std::string device = trainingDevice();
  at::set_num_threads(1);
  torch::manual_seed(0);
  at::Tensor x = torch::randn({16, 8}), y = torch::randn({16, 4});
  double ref_loss = 0.0;
  const auto ref = mlpReference(x, y, &ref_loss);
  for (const char* schedule : {"1F1B", "ZBVZeroBubble"}) {
    SCOPED_TRACE(schedule);
    const bool v = std::string(schedule) == "ZBVZeroBubble";
    auto seen = onThreads(v ? 1 : 2, [&](int, std::shared_ptr<Communicator> comm) {
      RunnerOptions o = mlpOptions(schedule, 4);
      o.device = device;
      if (v) o.stages_per_rank = 2;
      PipelineRunner runner(o, comm);
      StepResult r = runner.trainStep({x}, {y});
      std::map<std::string, at::Tensor> grads;
      for (const auto& p : runner.parameters()) {
        EXPECT_EQ(p.tensor.device().str(), device) << p.name;
        grads[p.name] = p.tensor.grad().cpu();
      }
      return std::make_pair(r, grads);
    });
    const StepResult& last = seen.back().first;
    ASSERT_TRUE(last.has_loss);
    EXPECT_NEAR(last.loss, ref_loss, 1e-5);
    std::size_t compared = 0;
    for (const auto& [r, grads] : seen) {
      for (const auto& [name, g] : grads) {
        EXPECT_TRUE(torch::allclose(g, ref.at(name), 1e-5, 1e-6)) << name;
        ++compared;
      }
    }
    EXPECT_EQ(compared, ref.size());
  }
}

// Note [One read of the losses]: the host waits for the GPU a fixed number
// of times per step, not once per microbatch or action.
TEST(CudaTest, HostSyncsPerStepDoNotGrowWithMicrobatches) {
  const std::string device = trainingDevice();
  at::set_num_threads(1);
  torch::manual_seed(0);
  at::Tensor x = torch::randn({32, 8}), y = torch::randn({32, 4});
  std::map<int, std::int64_t> syncs;
  for (int microbatches : {4, 8}) {
    auto counts = onThreads(1, [&](int, std::shared_ptr<Communicator> comm) {
      RunnerOptions o = mlpOptions("ZBVZeroBubble", microbatches);
      o.device = device;
      o.stages_per_rank = 2;
      PipelineRunner runner(o, comm);
      runner.trainStep({x}, {y});  // the first step learns shapes
      runner.zeroGrad();
      compat::HostSyncCounter counter;
      runner.trainStep({x}, {y});
      return counter.count();
    });
    syncs[microbatches] = counts[0];
    std::cout << "host syncs per step on " << device << " with " << microbatches << " microbatches: " << counts[0] << "\n";
  }
  EXPECT_EQ(syncs[4], syncs[8]);
  EXPECT_LE(syncs[8], 2);
}

}  // namespace
}  // namespace pipeforge::runtime
