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

// The model cut before every submodule call `open_depth` levels of calls
// below forward (0: the calls forward makes itself), one stage per call, as
// partitioner::policyUnits finds them: ops before the first call join it,
// ops between two calls join the first. Example-input meta is recorded as
// splitInMemory records it; the spec's cuts and policy are not used. What
// `pipeforge inspect --depth` draws.
SplitResult splitAtCalls(const torch::jit::Module& model, const partitioner::SplitSpec& spec, int open_depth);

// Per forward argument of `model`, the embedding that indexes it directly
// (pipe.json "input_embeddings"); empty when none does.
std::vector<InputEmbedding> inputEmbeddings(const torch::jit::Module& model);

// Deterministic tensors matching the spec's example_inputs.
std::vector<c10::IValue> makeExampleInputs(const partitioner::SplitSpec& spec);

}  // namespace pipeforge::stage
