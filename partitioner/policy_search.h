// How deep to open the model before partitioning it (Note [Policy depth search]).
//
// The search opens the model's calls one level at a time, builds its DAG and
// partitions it; a cost policy measures its units through a callback, so
// partitioner/ runs no stage module itself (stage/ supplies the measuring).
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "frontend/model_dag.h"
#include "frontend/opened_model.h"
#include "partitioner/partition.h"
#include "partitioner/split_spec.h"

namespace torch::jit {
struct Module;
}

namespace pipeforge::partitioner {

// The cost of each unit [unit_starts[i], unit_starts[i+1]) of `dag` (the last
// runs to the outputs vertex), one per unit, for Policy::kCost.
using MeasureUnitCosts = std::function<std::vector<double>(
    const frontend::OpenedModel& opened, const frontend::ModelDag& dag, const std::vector<size_t>& unit_starts)>;

// The model opened as deep as the search chose, its DAG and its partition.
struct ChosenPartition {
  frontend::OpenedModel opened;
  frontend::ModelDag dag;
  Partition partition;
};

// Opens `model` (calls to the ancestors of the split points, and for a policy
// as many levels as the search picks), and partitions it by `spec`. `measure`
// is called once per level tried when spec.policy is Policy::kCost, and never
// otherwise. Throws SpecError as explicitCuts and partitionDag do.
ChosenPartition searchPartition(const torch::jit::Module& model, const SplitSpec& spec,
                                const MeasureUnitCosts& measure);

}  // namespace pipeforge::partitioner
