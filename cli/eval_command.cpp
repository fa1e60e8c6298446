// `pipeforge eval --config C.yaml [--checkpoint CKPT] [--batches N] [--nproc P]`.
#include <CLI/CLI.hpp>

#include <memory>

#include "cli/commands.h"
#include "cli/launch_options.h"
#include "cli/override_options.h"
#include "cli/run_guarded.h"
#include "tools/evaluate_checkpoint.h"

namespace pipeforge::cli {

void addEvalCommand(CLI::App& app, int& exit_code) {
  auto request = std::make_shared<train::EvalRequest>();
  auto batches = std::make_shared<std::int64_t>(0);
  auto* sub = app.add_subcommand(
      "eval",
      "Report the held-out loss of a checkpoint on a training config's data: the same held-out batches, "
      "microbatches and pipeline as the training run's evaluation, on local ranks.");
  sub->add_option("--config", request->config_path, "training config YAML")->required();
  sub->add_option("--checkpoint", request->checkpoint,
                  "checkpoint folder (its `latest`) or one step_<N> folder (default: the newest intact one in "
                  "checkpoint.dir)");
  sub->add_option("--batches", *batches, "held-out batches to average (default: training.eval_batches)");
  sub->add_option("--outputs", request->outputs,
                  "also save the model's outputs on those batches to this file (torch.load gives a tuple, one "
                  "tensor per model output over every held-out row in order; PyTorch's return_outputs)");
  sub->add_option("--outputs-dir", request->outputs_dir, "(for the launcher's ranks) where each replica leaves its outputs")
      ->group("");
  addLaunchOptions(sub, request->launch, request->split_dir,
                   LaunchHelp{"local ranks (default: the config's layout, stages / stages_per_rank x data_parallel)",
                              "the split to load"});
  auto overrides = std::make_shared<OverrideOptions>(sub);
  sub->callback([=, &exit_code] {
    exit_code = runGuarded("eval", [&] {
      request->overrides = overrides->collect();
      if (sub->count("--batches") > 0) request->batches = *batches;
      train::runEvalRequest(*request);
      return kExitOk;
    });
  });
}

}  // namespace pipeforge::cli
