// The plan of a run: computed once per rank, handed down.
#pragma once

#include <string>

#include "config/train_config.h"
#include "data/data_layout.h"
#include "mesh/mesh_layout.h"
#include "runtime/dist_env.h"
#include "schedules/program.h"
#include "stage/manifest.h"

namespace pipeforge::train {

// Note [One plan per run]
// ~~~~~~~~~~~~~~~~~~~~~~~
// What a rank needs to know before it trains or evaluates: who it is (the
// environment), what it runs (pipe.json and the program) and how the ranks
// are laid out (pp x dp). Each is worked out once, by planRun, and handed
// down: the trainer and the runner take them from the plan (RunnerOptions's
// env, manifest and program) instead of resolving the environment, reading
// pipe.json or generating the schedule again. One source also means the
// checks and the run cannot disagree: the program checkLayout accepted is
// the program that runs.
struct RunPlan {
  runtime::DistEnv env;
  std::string split_dir;
  stage::PipeManifest manifest;  // split_dir's pipe.json
  mesh::MeshLayout mesh;         // the ranks' pp × tp × dp layout (Note [Mesh order])
  int pipeline_ranks = 1;        // mesh.size(kPp): the ranks of one replica's pipeline
  // The microbatch cuts of the inputs and targets, resolved against the
  // manifest's inputs: the runner cuts and the dataset draws by the same one.
  DataLayout data;
  // The compute-only program: pipeline.schedule_csv's, the named schedule
  // generated for the layout, or for `auto` the profiling program that the
  // trainer replaces with its choice (Note [Auto schedule]).
  schedules::Program program;
};

// Reads split_dir's pipe.json and checks the layout and the input chunks
// against it (ConfigError naming the keys to change).
RunPlan planRun(const TrainConfig& config, const runtime::DistEnv& env, const std::string& split_dir);

// The plan of a generation (`pipeforge generate`), which has no training
// config: one stage per rank, no data-parallel replicas, and GPipe's program
// on one microbatch (forward only, so every schedule is the same chain of
// stages). Reads split_dir's pipe.json; no dataset, so `data` stays empty.
RunPlan planGeneration(const runtime::DistEnv& env, const std::string& split_dir);

}  // namespace pipeforge::train
