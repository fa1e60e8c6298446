// estimateModelState (train/model_state.h): what `pipeline.schedule: auto`
// takes off pipeline.memory_limit before the first step, per ZeRO stage.
#include "train/model_state.h"

#include "runtime/pipeline_runner.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace pipeforge::train {
namespace {

std::vector<runtime::NamedTensor> parameters() {
  // 10 and 7 trainable elements (7 is not divisible by 2: the largest piece
  // is 4), a frozen 3 and a tied alias of the first, counted once.
  at::Tensor a = at::zeros({10}).requires_grad_(true);
  at::Tensor b = at::zeros({7}).requires_grad_(true);
  at::Tensor frozen = at::zeros({3});
  return {{"a", a, 0}, {"b", b, 0}, {"frozen", frozen, 0}, {"a_tied", a, 1}};
}

TEST(EstimateModelState, EachZeroStageShardsWhatItShardsAsTheRunMeasuresIt) {
  struct Case {
    int zero;
    std::int64_t param, grad, optimizer;
  };
  // AdamW: two state tensors per trainable element; pieces of 5 and 4 elements over 2 replicas.
  for (const Case& c : {Case{0, 20 * 4, 17 * 4, 2 * 17 * 4}, Case{1, 20 * 4, 17 * 4, 2 * 9 * 4},
                        Case{2, 20 * 4, 9 * 4, 2 * 9 * 4}, Case{3, (5 + 4 + 2) * 4, 9 * 4, 2 * 9 * 4}}) {
    const ModelStateBytes m = estimateModelState(3, parameters(), OptimizerName::kAdamW, 0.0, c.zero, 2);
    EXPECT_EQ(m.rank, 3);
    EXPECT_EQ(m.parameters, 20) << "zero " << c.zero;
    EXPECT_EQ(m.param_bytes, c.param) << "zero " << c.zero;
    EXPECT_EQ(m.grad_bytes, c.grad) << "zero " << c.zero;
    EXPECT_EQ(m.optimizer_bytes, c.optimizer) << "zero " << c.zero;
  }
  // One replica shards nothing; SGD without momentum keeps no state.
  EXPECT_EQ(estimateModelState(0, parameters(), OptimizerName::kAdamW, 0.0, 3, 1).param_bytes, 20 * 4);
  EXPECT_EQ(estimateModelState(0, parameters(), OptimizerName::kSgd, 0.0, 1, 2).optimizer_bytes, 0);
  EXPECT_EQ(estimateModelState(0, parameters(), OptimizerName::kSgd, 0.9, 1, 2).optimizer_bytes, 9 * 4);
}

}  // namespace
}  // namespace pipeforge::train
