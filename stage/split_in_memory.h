// The split pipeline without files: frontend -> partitioner -> stage builder.
#pragma once

#include <vector>

#include "frontend/model_dag.h"
#include "frontend/opened_model.h"
#include "partitioner/partition.h"
#include "partitioner/split_spec.h"
#include "stage/build_stages.h"

namespace c10 {
struct IValue;
}
namespace torch::jit {
struct Module;
}

namespace pipeforge::stage {

struct SplitResult {
  frontend::OpenedModel opened;
  frontend::ModelDag dag;
  partitioner::Partition partition;
  BuiltStages stages;
};

SplitResult splitInMemory(const torch::jit::Module& model, const partitioner::SplitSpec& spec);

// Deterministic tensors matching the spec's example_inputs.
std::vector<c10::IValue> makeExampleInputs(const partitioner::SplitSpec& spec);

}  // namespace pipeforge::stage
