// `pipeforge inspect MODEL.pt | DIR [--spec S.yaml] [--format text|json|dot|svg] [--stage i] [--out FILE]`.
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
#include "inspect/graph_view.h"
#include "inspect/pipe_view.h"
#include "inspect/text_view.h"

namespace pipeforge::cli {
namespace {

struct InspectOptions {
  std::string path;
  std::string spec;
  std::string format = "text";
  int stage = -1;
  std::string out;
};

int runInspect(const InspectOptions& o) {
  auto view = inspect::loadPipeView(o.path, o.spec.empty() ? std::nullopt : std::optional<std::string>(o.spec));
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
      "(text), the DAG and partition (json), or the DAG coloured by stage (dot, svg).");
  sub->add_option("path", options->path, "a TorchScript model file or a folder written by `pipeforge split`")->required();
  sub->add_option("--spec", options->spec, "split a model file in memory with this spec before showing it");
  sub->add_option("--format", options->format, "text | json | dot | svg")
      ->check(CLI::IsMember({"text", "json", "dot", "svg"}));
  sub->add_option("--stage", options->stage, "show only this stage");
  sub->add_option("--out", options->out, "write to this file instead of standard output");
  sub->callback([options, &exit_code] { exit_code = runGuarded("inspect", [&] { return runInspect(*options); }); });
}

}  // namespace pipeforge::cli
