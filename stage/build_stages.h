// Building one FQN-preserving TorchScript module per stage, in memory.
//
// For the seed example split at `layers.1: BEGINNING`, stage 0 holds `emb` and
// `layers.0.lin`, stage 1 holds `layers.1.lin` and `lm.proj`, all under their
// original names: a stage's `layers` is a new container holding only `0`.
// Modules a stage calls whole are the original objects; modules the split
// opened become new containers with only the children, parameters, buffers
// and attributes the stage reads. Each forward takes the stage inputs in
// manifest order and always returns a tuple.
#pragma once

#include <torch/script.h>

#include <vector>

#include "frontend/model_dag.h"
#include "frontend/opened_model.h"
#include "partitioner/partition.h"
#include "stage/manifest.h"

namespace pipeforge::stage {

class StageBuildError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct BuiltStages {
  std::vector<torch::jit::Module> modules;
  PipeManifest manifest;  // files named stage_<i>.pt; source left empty
};

BuiltStages buildStages(const frontend::OpenedModel& model, const frontend::ModelDag& dag,
                        const partitioner::Partition& partition);

// Runs the stages as the manifest chains them; returns the model outputs.
// `stage_seconds`, when given, receives each stage's wall time.
std::vector<at::Tensor> runChained(std::vector<torch::jit::Module>& modules, const PipeManifest& manifest,
                                   const std::vector<c10::IValue>& inputs,
                                   std::vector<double>* stage_seconds = nullptr,
                                   std::vector<std::vector<at::Tensor>>* stage_outputs = nullptr);

}  // namespace pipeforge::stage
