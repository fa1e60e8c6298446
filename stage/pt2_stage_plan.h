// Which nodes of an exported program each stage of a split computes, and
// what each `stage_<i>.pt2` takes, holds and returns (Note [PT2 stage files]
// in pt2_stage_plan.cpp).
//
// An analysis: it reads the imported program's partition through the node
// tags the importer left (Note [PT2 node tags]) and the exported graph's own
// value names, and changes neither.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "stage/manifest.h"

namespace pipeforge::frontend {
class Pt2Archive;
struct ModelDag;
}  // namespace pipeforge::frontend

namespace pipeforge::partitioner {
struct Partition;
}

namespace pipeforge::stage {

struct Pt2StagePlan {
  // Positions in the exported graph's `nodes`, in graph order: the nodes the
  // stage computes and the symbolic-size nodes it recomputes.
  std::vector<int> nodes;
  // Per node: value renames, a tied weight read under the name the node's
  // module holds it by ("p_lm_head_weight" -> "p_wte_weight" inside `wte`).
  std::map<int, std::map<std::string, std::string>> renames;
  // Lifted inputs (parameters, buffers, constants) the stage reads, as
  // positions in the program's signature().inputs, in signature order.
  std::vector<int> lifted;
  // The stage's user inputs: exported value names, in manifest order.
  std::vector<std::string> inputs;
  // Functional-IR buffer updates the stage computes: value -> buffer FQN.
  std::vector<std::pair<std::string, std::string>> mutations;
  // The stage's user outputs: exported value names, in manifest order.
  std::vector<std::string> outputs;
};

struct Pt2SplitPlan {
  std::vector<Pt2StagePlan> stages;
  PipeManifest manifest;  // files stage_<i>.pt2; source and digests left empty
};

// Plans the `.pt2` stage files for `partition` of the model imported from
// `archive` (the DAG and partition the stage builder used). Throws
// StageBuildError naming the value and the fix where a stage would need a
// value that no `.pt2` stage can receive (only tensors cross stages).
Pt2SplitPlan planPt2Stages(const frontend::Pt2Archive& archive, const frontend::ModelDag& dag,
                           const partitioner::Partition& partition);

}  // namespace pipeforge::stage
