// What a rank keeps for its model: the bytes of its parameters, their
// gradients and its optimizer state, each storage counted once (the
// `model_state` record of metrics.jsonl, issue 42). With every stage whole on
// every replica (no sharding yet), fp32 AdamW keeps 4 + 4 + 8 = 16 bytes per
// parameter, SGD with momentum 12, plain SGD 8.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "config/train_config.h"
#include "train/optimizer_factory.h"

namespace torch::optim {
class Optimizer;
}

namespace pipeforge::runtime {
struct NamedTensor;
}

namespace pipeforge::train {

struct ModelStateBytes {
  int rank = 0;
  std::int64_t parameters = 0;  // elements, each tensor once
  std::int64_t param_bytes = 0;
  std::int64_t grad_bytes = 0;
  std::int64_t optimizer_bytes = 0;
  std::int64_t total() const { return param_bytes + grad_bytes + optimizer_bytes; }
};

// Measures this rank's `parameters` (after a backward, so their gradients
// exist) and its stages' `optimizers` (after a step, so their state does),
// whose state is keyed by the tensors `stepped` lists per stage: the
// parameters, or with pipeline.zero_stage this rank's pieces of them.
// `held_gradients` (zero_stage 2: the gradient pieces the rank keeps) stand
// for the parameters' gradients when given. Tied names of one tensor count once.
// `held_parameters` (zero_stage 3) stand for the parameters the same way:
// the rank's piece buffers, and the whole parameters' element count.
struct HeldParameters {
  std::vector<at::Tensor> tensors;
  std::int64_t elements = 0;
};
ModelStateBytes measureModelState(int rank, const std::vector<runtime::NamedTensor>& parameters,
                                  const std::map<int, std::unique_ptr<torch::optim::Optimizer>>& optimizers,
                                  const std::map<int, std::vector<NamedParameter>>& stepped, OptimizerName name,
                                  const std::vector<at::Tensor>& held_gradients = {},
                                  const HeldParameters* held_parameters = nullptr);

// Before the first step: the bytes measureModelState will find after it,
// from the parameters alone: each trainable one gets a gradient of its
// size, Adam(W) two state tensors of it, SGD one with momentum and none
// without. With pipeline.zero_stage z over `replicas` (Note [Shards]),
// this rank's largest piece of each: of the optimizer state from z = 1, of
// the gradients from z = 2 and of the parameters at z = 3, as
// measureModelState counts them.
ModelStateBytes estimateModelState(int rank, const std::vector<runtime::NamedTensor>& parameters, OptimizerName name,
                                   double momentum, int zero_stage = 0, int replicas = 1);

// {"event": "model_state", "rank": r, "parameters": n, "param_bytes": ...,
// "grad_bytes": ..., "optimizer_bytes": ..., "bytes_per_parameter": ...}, and back.
nlohmann::json modelStateRecord(const ModelStateBytes& bytes);
ModelStateBytes modelStateFromRecord(const nlohmann::json& record);

// "rank 0: 1.2 MB parameters, 1.2 MB gradients, 2.4 MB optimizer state (16.0 bytes per parameter)".
std::string describeModelState(const ModelStateBytes& bytes);

}  // namespace pipeforge::train
