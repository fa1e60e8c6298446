// Assigning every DAG vertex to a stage.
//
// Stages are contiguous ranges of the DAG's vertex order (graph order, a
// topological order), as PyTorch cuts its traced program at pipe_split():
// a cut before vertex v starts a new stage at v. Cuts come from split_points
// (BEGINNING: before the first vertex of the module; END: after its last),
// pipe_split() markers, and an automatic policy that adds cuts at submodule
// calls to balance a weight (parameter bytes, measured time, call count).
#pragma once

#include <string>
#include <vector>

#include "frontend/model_dag.h"
#include "partitioner/split_spec.h"

namespace pipeforge::partitioner {

struct Partition {
  int num_stages = 0;
  std::vector<int> stage_of_vertex;  // indexed by DAG vertex id; inputs vertex -> 0, outputs -> last
  std::string balance;               // "policy parameters: max/mean 1.08 (...)" when a policy ran
  double imbalance = 1.0;            // max/mean stage weight when a policy ran
};

// Units an automatic policy can move between stages: vertex ranges that start
// at a submodule call. Costs for Policy::kCost are measured per unit by the caller.
struct PolicyUnits {
  std::vector<size_t> starts;  // first vertex of each unit; unit i = [starts[i], starts[i+1])
};

// The candidate cut positions of `dag` for a policy (one per submodule call
// after the first vertex that does work).
PolicyUnits policyUnits(const frontend::ModelDag& dag);

// A module whose code runs inside a node with blocks of the opened graph,
// which stays whole in one stage, and what that node is: "a loop or if body",
// or an exported program's region ("a torch.no_grad() region of
// model.rotary_emb (modeling_llama.py:98)", Note [PT2 regions]).
struct ControlFlowPath {
  std::string fqn;
  std::string inside;
};

// Cuts named by the spec's split_points and the graph's markers, as vertex
// positions. Throws SpecError for unknown FQNs (with near matches), split
// points inside control flow (naming it), and FQNs forward never calls.
std::vector<size_t> explicitCuts(const frontend::ModelDag& dag, const SplitSpec& spec,
                                 const std::vector<std::string>& module_paths,
                                 const std::vector<ControlFlowPath>& control_flow_paths);

// Stage k is the vertex range [starts[k], starts[k+1]) (the last runs to the
// end); the inputs vertex goes to stage 0 and the outputs vertex to the last.
// `starts` ascending, starts[0] <= the first vertex that does work.
Partition partitionAtStarts(const frontend::ModelDag& dag, const std::vector<size_t>& starts);

// Builds the partition. `unit_costs` (one per policy unit) is required for Policy::kCost.
// Throws SpecError for an empty stage, more stages than cut points, or no split at all.
Partition partitionDag(const frontend::ModelDag& dag, const SplitSpec& spec, const std::vector<size_t>& cuts,
                       const std::vector<double>& unit_costs = {});

}  // namespace pipeforge::partitioner
