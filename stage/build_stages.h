// Building one FQN-preserving TorchScript module per stage, in memory.
//
// For the seed example split at `layers.1: BEGINNING`, stage 0 holds `emb` and
// `layers.0.lin`, stage 1 holds `layers.1.lin` and `lm.proj`, all under their
// original names: a stage's `layers` is a new container holding only `0`.
// Modules a stage calls whole are the original objects; modules the split
// opened become new containers with only the children, parameters, buffers
// and attributes the stage reads. Each forward takes the stage inputs in
// manifest order and always returns a tuple. What goes where is decided by
// the analyses in stage/stage_plan.h; this file only builds.
#pragma once

#include <string>
#include <vector>

#include "stage/errors.h"
#include "stage/manifest.h"

namespace torch::jit {
struct Module;
}

namespace pipeforge::frontend {
class OpenedModel;
struct ModelDag;
}  // namespace pipeforge::frontend

namespace pipeforge::partitioner {
struct Partition;
}

namespace pipeforge::stage {


struct SplitPlan;

struct BuiltStages {
  // Out of line: torch::jit::Module is only declared here.
  BuiltStages();
  ~BuiltStages();
  BuiltStages(BuiltStages&&) noexcept;
  BuiltStages& operator=(BuiltStages&&) noexcept;

  std::vector<torch::jit::Module> modules;
  PipeManifest manifest;  // files named stage_<i>.pt; source left empty
};

// planStages, then buildStagesFromPlan.
BuiltStages buildStages(const frontend::OpenedModel& model, const frontend::ModelDag& dag,
                        const partitioner::Partition& partition);

// Builds the stages `plan` (made by planStages for `model` and `dag`) describes.
BuiltStages buildStagesFromPlan(const frontend::OpenedModel& model, const frontend::ModelDag& dag,
                                const SplitPlan& plan);

}  // namespace pipeforge::stage
