// What each stage of a split holds: the analysis the stage builder follows.
//
// planStages says, per stage, which nodes of the opened graph it computes,
// what it receives and what it sends, in manifest order, and what its graph
// inputs are called. planStageModules says, from the graph built for one
// stage, which submodules the stage keeps whole and which it opens, with
// what inside. Both only read; buildStages (build_stages.h) turns them into
// TorchScript modules and pipe.json. For a model whose `blk` calls `blk.x`
// then `blk.y` and scales by its parameter `blk.scale`, split at
// `blk.y: BEGINNING`, stage 1's modules print as
//
//   opened blk
//   whole blk.y
//   parameter blk.scale
//
// (Note [Stage module trees] in the .cpp).
#pragma once

#include <string>
#include <vector>

#include "stage/manifest.h"
#include "stage/stage_dataflow.h"

namespace torch::jit {
struct Graph;
struct Module;
}  // namespace torch::jit

namespace pipeforge::frontend {
class OpenedModel;
struct ModelDag;
}  // namespace pipeforge::frontend

namespace pipeforge::partitioner {
struct Partition;
}

namespace pipeforge::stage {

// One stage: what it computes, receives and sends, and its inputs' names.
struct StagePlan {
  StageDataflow flow;
  // The debug name of each graph input, one per flow.inputs: `in<i>_` and
  // the value's name made an identifier (TorchScript archives with names
  // like `h0.1_in` fail to load). The builder later gives inputs that are
  // model arguments the argument's own name (Note [Stage signatures]).
  std::vector<std::string> input_names;
};

struct SplitPlan {
  std::vector<std::string> model_inputs;   // forward's arguments, `self` excluded
  std::vector<ValueSource> model_outputs;  // the model's outputs, in order
  std::vector<StagePlan> stages;
};

// Throws StageBuildError where the split cannot be exact (planDataflow).
SplitPlan planStages(const frontend::OpenedModel& model, const frontend::ModelDag& dag,
                     const partitioner::Partition& partition);

// "stage 0\n  emits: call layers.0, aten::relu\n  input 0: model input 0 as %x.1 (in0_x_1)\n ..."
std::string toString(const SplitPlan& plan);

// One thing a stage's module tree holds, under its original FQN.
struct StageModuleEntry {
  enum class Kind {
    kOpened,     // a new, empty container that later entries fill
    kWhole,      // the model's own submodule object, with all it holds
    kParameter,  // the model's tensor, registered on the opened container
    kBuffer,
    kAttribute,  // a non-tensor attribute (an int, a flag), its current value
  };
  Kind kind = Kind::kOpened;
  std::string fqn;

  friend bool operator==(const StageModuleEntry& a, const StageModuleEntry& b) {
    return a.kind == b.kind && a.fqn == b.fqn;
  }
};

// A stage's module tree, in the order the builder registers it: every entry
// goes on the container of its FQN's parent ("" is the stage's root), which
// an earlier kOpened entry made. The order is the order of the stage's
// parameters and buffers in the manifest.
struct StageModules {
  std::vector<StageModuleEntry> entries;
};

// Reads the prim::GetAttr nodes of `stage_graph`, whose first input is the
// model's `self`, against `model`.
StageModules planStageModules(const torch::jit::Module& model, const torch::jit::Graph& stage_graph);

// One line per entry: "opened layers", "whole layers.0", "parameter lm.proj.weight".
std::string toString(const StageModules& modules);

}  // namespace pipeforge::stage
