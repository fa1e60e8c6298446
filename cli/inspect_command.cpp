// `pipeforge inspect MODEL.pt | DIR | CKPT [--spec S.yaml] [--format text|json|dot|svg] [--stage i | --depth N] [--out FILE]`.
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "cli/run_guarded.h"
#include "common/atomic_file.h"
#include "common/error.h"
#include "inspect/checkpoint_view.h"
#include "inspect/graph_view.h"
#include "inspect/module_view.h"
#include "inspect/module_view_render.h"
#include "inspect/pipe_view.h"
#include "inspect/text_view.h"

namespace pipeforge::cli {
namespace {

struct InspectOptions {
  std::string path;
  std::string spec;
  std::string format = "text";
  int stage = -1;
  std::optional<int> depth;
  std::string out;
};

std::optional<std::string> specOf(const InspectOptions& o) {
  return o.spec.empty() ? std::nullopt : std::optional<std::string>(o.spec);
}

// --depth N: the module view (inspect/module_view.h) in the chosen format.
std::string moduleViewIn(const InspectOptions& o) {
  if (o.stage >= 0) {
    throw Error(ErrorCode::kUserInput, "--stage and --depth do not go together: --depth draws the whole model, "
                                       "one node per module, and --stage one stage of a split; drop one of them");
  }
  const inspect::ModuleView view = inspect::loadModuleView(o.path, specOf(o), *o.depth);
  if (o.format == "text") return inspect::moduleViewText(view);
  if (o.format == "json") return inspect::moduleViewJson(view);
  if (o.format == "dot") return inspect::moduleViewDot(view);
  return inspect::renderSvg(inspect::moduleViewDot(view));
}

// The pipe view: every stage's aten graph (dot, svg, json) or module tree (text).
std::string pipeViewIn(const InspectOptions& o) {
  auto view = inspect::loadPipeView(o.path, specOf(o));
  std::optional<int> only;
  if (o.stage >= 0) {
    if (o.stage >= view.manifest.num_stages) {
      throw Error(ErrorCode::kUserInput, "--stage " + std::to_string(o.stage) + ": the pipe has " +
                                             std::to_string(view.manifest.num_stages) + " stages (0.." +
                                             std::to_string(view.manifest.num_stages - 1) + ")");
    }
    only = o.stage;
  }
  std::string text;
  if (o.format == "text") {
    if (only) {
      text = inspect::stageText(view, *only);
    } else {
      text = inspect::moduleTree(view) + "\n" + inspect::rootDataflow(view);
      const std::string boundaries = inspect::stageBoundaries(view);
      if (!boundaries.empty()) text += "\n" + boundaries;
      if (!view.balance.empty()) text += "\n" + view.balance + "\n";
    }
  } else if (o.format == "json") {
    text = inspect::pipeJson(view, only);
  } else if (o.format == "dot") {
    text = inspect::pipeDot(view, only);
  } else {
    text = inspect::renderSvg(inspect::pipeDot(view, only));
  }
  return text;
}

// A checkpoint: its metadata and stage indexes, never its tensors.
std::string checkpointViewIn(const InspectOptions& o) {
  if (o.depth || !o.spec.empty() || o.format == "dot" || o.format == "svg") {
    throw Error(ErrorCode::kUserInput, "'" + o.path + "' is a checkpoint: inspect shows it as --format text or json "
                                       "(with --stage i for one stage); --depth, --spec, dot and svg are for models "
                                       "and splits");
  }
  std::optional<int> only;
  if (o.stage >= 0) only = o.stage;
  return o.format == "json" ? inspect::checkpointJson(o.path, only) : inspect::checkpointText(o.path, only);
}

int runInspect(const InspectOptions& o) {
  const std::string text = inspect::isCheckpointPath(o.path) ? checkpointViewIn(o)
                           : o.depth                         ? moduleViewIn(o)
                                                             : pipeViewIn(o);
  if (o.out.empty()) {
    std::cout << text;
    return kExitOk;
  }
  writeFileAtomically(o.out, text);
  return kExitOk;
}

}  // namespace

void addInspectCommand(CLI::App& app, int& exit_code) {
  auto options = std::make_shared<InspectOptions>();
  auto* sub = app.add_subcommand(
      "inspect",
      "Show a model or a split: the module tree of each stage (as PyTorch's print(pipe)) and the root dataflow "
      "(text), the DAG and partition (json), or the DAG coloured by stage (dot, svg); with --depth, one node per "
      "module instead of one per aten op.");
  sub->add_option("path", options->path,
                  "a model file, TorchScript (.pt) or torch.export (.pt2), a folder written by `pipeforge split`, or a "
                  "checkpoint (CKPT, or CKPT/step_<N>: its step, layout, tensors and optimizer state, read from "
                  "its metadata alone)")
      ->required();
  sub->add_option("--spec", options->spec, "split a model file in memory with this spec before showing it (with --depth, only its example_inputs and constant_inputs apply)");
  sub->add_option("--format", options->format, "text | json | dot | svg")
      ->check(CLI::IsMember({"text", "json", "dot", "svg"}));
  sub->add_option("--stage", options->stage, "show only this stage");
  sub->add_option("--depth", options->depth,
                  "module view: one node per module call N levels of calls deep (1: the modules forward calls "
                  "itself; 2: also the modules those call, e.g. a transformers model's blocks), with the values "
                  "crossing each cut between them, their shapes and bytes (shapes from --spec's example_inputs); "
                  "a model file only, in every --format");
  sub->add_option("--out", options->out, "write to this file instead of standard output");
  sub->callback([options, &exit_code] { exit_code = runGuarded("inspect", [&] { return runInspect(*options); }); });
}

}  // namespace pipeforge::cli
