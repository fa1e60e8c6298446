// `pipeforge split MODEL.pt|MODEL.pt2 [--spec SPEC.yaml] [--weights SRC ...] --out DIR [--force]`.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/run_guarded.h"
#include "stage/split_model.h"

namespace pipeforge::cli {

void addSplitCommand(CLI::App& app, int& exit_code) {
  auto request = std::make_shared<stage::SplitRequest>();
  auto spec = std::make_shared<std::string>();
  auto* sub = app.add_subcommand(
      "split",
      "Split a PyTorch model into pipeline stages: a TorchScript .pt (torch.jit.script/trace) or a "
      "torch.export .pt2 (torch.export.save).\n"
      "Writes DIR/stage_<i>.pt (stage_<i>.pt2 for a .pt2 model; one module per stage, original parameter names "
      "kept) and DIR/pipe.json (the dataflow between stages). Cut points come from --spec (split_points, "
      "num_stages + policy) and from pipe_split() markers in forward.");
  sub->add_option("model", request->model_path, "model file: TorchScript (.pt) or torch.export (.pt2)")->required();
  sub->add_option("--spec", *spec, "split spec YAML (see configs/split_*.yaml); optional with pipe_split() markers");
  sub->add_option("--out", request->out_dir, "output folder (must not exist unless --force)")->required();
  sub->add_flag("--force", request->force, "replace an existing output folder");
  sub->add_option("--weights", request->weights,
                  "take every parameter and buffer by name from SRC: a .safetensors file or a save_pretrained folder "
                  "(model.safetensors, or model.safetensors.index.json and its shards); repeatable, a later SRC fills "
                  "what earlier ones lack. Needed for a meta-device export")
      ->type_name("SRC");
  sub->add_flag("--accept-unused-weights", request->accept_unused_weights,
                "ignore tensors in --weights that no tensor of the model takes (refused otherwise)");
  sub->callback([request, spec, &exit_code] {
    exit_code = runGuarded("split", [&] {
      if (!spec->empty()) request->spec_path = *spec;
      auto summary = stage::splitModelToDirectory(*request);
      if (!summary.balance.empty()) std::cout << summary.balance << "\n";
      const auto& m = summary.manifest;
      std::cout << fmt::format("split {} into {} stages -> {}\n", request->model_path, m.num_stages, request->out_dir);
      for (const auto& s : m.stages) {
        std::cout << fmt::format("  stage {}: {} inputs, {} outputs, {} parameters, {} buffers ({})\n", s.index,
                                 s.inputs.size(), s.num_outputs, s.parameters.size(), s.buffers.size(), s.file);
      }
      for (const auto& group : m.tied) std::cout << fmt::format("  tied: {}\n", fmt::join(group, " = "));
      return kExitOk;
    });
  });
}

}  // namespace pipeforge::cli
