// `pipeforge export CKPT --model ORIGINAL.pt|.pt2 --out trained.pt|.pt2|DIR [--format safetensors ...]`.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/run_guarded.h"
#include "tools/export_model.h"

namespace pipeforge::cli {

void addExportCommand(CLI::App& app, int& exit_code) {
  auto request = std::make_shared<train::ExportRequest>();
  auto* sub = app.add_subcommand(
      "export",
      "Write the model a run was split from with the trained weights of a checkpoint: --out *.pt writes "
      "TorchScript (loads with torch.jit.load; tied parameters keep sharing one tensor), from a .pt or a .pt2 "
      "model; --out *.pt2, from a .pt2 model, writes its torch.export archive with the new weights (loads "
      "with torch.export.load).");
  sub->add_option("checkpoint", request->checkpoint, "checkpoint folder (its `latest`) or one step_<N> folder")
      ->required();
  sub->add_option("--model", request->model_path,
                  "the model the run was split from: TorchScript (.pt) or torch.export (.pt2)")
      ->required();
  sub->add_option("--out", request->out_path,
                  "output file: .pt (TorchScript), or .pt2 (torch.export) when the model is a .pt2; with --format "
                  "safetensors a folder")
      ->required();
  sub->add_flag("--force", request->force, "replace an existing output file or folder");
  sub->add_option("--format", request->format,
                  "safetensors: write what transformers' save_pretrained writes (model.safetensors, or shards and "
                  "model.safetensors.index.json) under the model's names, one stage in memory at a time");
  sub->add_option("--like", request->like,
                  "with --format safetensors: the save_pretrained folder the run started from; copies its config and "
                  "tokenizer files, and names tied weights as it does");
  sub->add_option("--dtype", request->dtype, "with --format safetensors: float32, bfloat16 or float16");
  sub->add_option("--max-shard-size", request->max_shard_size,
                  "with --format safetensors: the largest shard, as save_pretrained's max_shard_size (default 5GB)");
  sub->callback([request, &exit_code] {
    exit_code = runGuarded("export", [&] {
      auto s = train::exportTrainedModel(*request);
      std::cout << fmt::format("exported step {} of {} ({} parameters, {} buffers, {} tied groups) -> {}\n", s.step,
                               s.checkpoint_dir, s.parameters, s.buffers, s.tied_groups, request->out_path);
      if (!s.kept_unused.empty()) {
        std::cout << fmt::format("kept {} parameters/buffers that forward never reads as they are in '{}': {}\n",
                                 s.kept_unused.size(), request->model_path, fmt::join(s.kept_unused, ", "));
      }
      return kExitOk;
    });
  });
}

}  // namespace pipeforge::cli
