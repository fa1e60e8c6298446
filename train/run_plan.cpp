#include "train/run_plan.h"

#include <optional>
#include <utility>

#include "schedules/generate.h"
#include "train/schedule_profile.h"

namespace pipeforge::train {

RunPlan planRun(const TrainConfig& config, const runtime::DistEnv& env, const std::string& split_dir) {
  RunPlan plan;
  plan.env = env;
  plan.split_dir = split_dir;
  plan.manifest = stage::readManifest(split_dir);
  std::optional<schedules::Program> program = checkLayout(config, env.world_size, plan.manifest.num_stages);
  plan.mesh = mesh::MeshLayout::fromWorld(env.world_size, config.pipeline.tensor_parallel, config.pipeline.data_parallel);
  plan.pipeline_ranks = plan.mesh.size(mesh::Axis::kPp);
  plan.data = dataLayoutFor(config, plan.manifest.inputs);
  // Note [Auto schedule] in train/auto_schedule_pick.h: start on the profiling
  // program; training replaces it with the chosen one, and evaluation (any
  // valid schedule computes the same) keeps it.
  plan.program = program ? std::move(*program)
                         : profilingProgram(plan.pipeline_ranks, config.pipeline.stages_per_rank,
                                            config.pipeline.microbatches);
  return plan;
}

RunPlan planGeneration(const runtime::DistEnv& env, const std::string& split_dir) {
  RunPlan plan;
  plan.env = env;
  plan.split_dir = split_dir;
  plan.manifest = stage::readManifest(split_dir);
  plan.mesh = mesh::MeshLayout::fromWorld(env.world_size, /*tp=*/1, /*dp=*/1);
  plan.pipeline_ranks = plan.mesh.size(mesh::Axis::kPp);
  schedules::ScheduleConfig one_chain;
  one_chain.num_ranks = env.world_size;
  one_chain.stages_per_rank = 1;
  one_chain.num_microbatches = 1;
  plan.program = schedules::generateSchedule("GPipe", one_chain);
  return plan;
}

}  // namespace pipeforge::train
