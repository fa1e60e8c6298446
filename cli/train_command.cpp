// `pipeforge train --config C.yaml [--nproc N]`.
#include <CLI/CLI.hpp>

#include <memory>

#include "cli/commands.h"
#include "cli/launch_options.h"
#include "cli/override_options.h"
#include "cli/run_guarded.h"
#include "launch/launch.h"

namespace pipeforge::cli {

void addTrainCommand(CLI::App& app, int& exit_code) {
  auto request = std::make_shared<train::TrainRequest>();
  auto stop_after = std::make_shared<std::int64_t>(0);
  auto* sub = app.add_subcommand(
      "train",
      "Train a model split into pipeline stages, one process per rank (see configs/train_example.yaml).\n"
      "With --nproc N: split the model once, then start N local ranks (Gloo over loopback). Without it: run as "
      "one rank of a job started by `torchrun --no-python` or `srun` (RANK, WORLD_SIZE, MASTER_ADDR, ...), or "
      "alone. Resumes from the checkpoint folder's `latest` when there is one.");
  sub->add_option("--config", request->config_path, "training config YAML")->required();
  sub->add_option("--stop-after", *stop_after, "stop after step N of the run (an absolute step, also after a resume), with a checkpoint there, as an "
                  "interrupt would");
  addLaunchOptions(sub, request->launch, request->split_dir,
                   LaunchHelp{"start this many local ranks (world = pipeline ranks x data_parallel)", "the split to train",
                              true});
  auto overrides = std::make_shared<OverrideOptions>(sub);
  sub->callback([request, stop_after, overrides, &exit_code] {
    exit_code = runGuarded("train", [&] {
      request->overrides = overrides->collect();
      if (*stop_after != 0) request->stop_after = *stop_after;
      return train::runTrainRequest(*request);  // a failed rank's status (Note [Run exit status])
    });
  });
}

}  // namespace pipeforge::cli
