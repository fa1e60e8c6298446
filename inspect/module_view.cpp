#include "inspect/module_view.h"

#include <torch/script.h>

#include <filesystem>

#include "common/error.h"
#include "frontend/load_model.h"
#include "frontend/model_dag.h"
#include "frontend/module_paths.h"
#include "inspect/text_view.h"
#include "partitioner/split_spec.h"
#include "stage/constant_inputs.h"
#include "stage/manifest.h"
#include "stage/split_in_memory.h"

namespace pipeforge::inspect {
namespace {

using frontend::DagNodeKind;

// Node k: the call its stage starts with, its other work, and the bytes of
// the parameters and buffers the stage holds.
std::vector<ModuleNode> describeNodes(const torch::jit::Module& model, const stage::SplitResult& split) {
  std::vector<ModuleNode> nodes(split.partition.num_stages);
  const auto& g = split.dag.graph;
  for (auto v : boost::make_iterator_range(boost::vertices(g))) {
    const auto& d = g[v];
    ModuleNode& node = nodes.at(split.partition.stage_of_vertex.at(v));
    if (d.kind == DagNodeKind::kCall && node.module.empty()) {
      node.module = d.callee;
      node.class_name = className(frontend::submoduleAt(model, d.callee));
    } else if (d.kind == DagNodeKind::kOp || d.kind == DagNodeKind::kControlFlow || d.kind == DagNodeKind::kCall) {
      ++node.ops;
    }
  }
  for (size_t k = 0; k < nodes.size(); ++k) {
    const auto& info = split.stages.manifest.stages.at(k);
    for (const auto* names : {&info.parameters, &info.buffers}) {
      for (const auto& fqn : *names) {
        auto it = split.dag.tensor_bytes.find(fqn);
        if (it != split.dag.tensor_bytes.end()) nodes[k].state_bytes += it->second;
      }
    }
  }
  return nodes;
}

}  // namespace

ModuleView loadModuleView(const std::string& path, const std::optional<std::string>& spec_path, int depth) {
  if (depth < 1) {
    throw Error(ErrorCode::kUserInput, "--depth " + std::to_string(depth) +
                                           ": the module view needs a depth of 1 or more (1: one node per module "
                                           "forward calls itself; 2: also the modules those call)");
  }
  if (std::filesystem::is_directory(path)) {
    const bool split = std::filesystem::exists(std::filesystem::path(path) / stage::kManifestFileName);
    const std::string source = split ? stage::readManifest(path).source : "";
    throw Error(ErrorCode::kUserInput,
                "--depth draws a model file, and '" + path + "' is a folder; inspect the model " +
                    (source.empty() ? std::string("itself") : "it was split from ('" + source + "')") +
                    " with --depth, or drop --depth to see the split");
  }
  partitioner::SplitSpec spec;
  if (spec_path) spec = partitioner::loadSplitSpec(*spec_path);
  stage::refuseConstantInputsForPt2(spec, path);
  torch::jit::Module model = frontend::loadModel(path);
  stage::SplitResult split = stage::splitAtCalls(model, spec, depth - 1);
  ModuleView view;
  view.source = path;
  view.depth = depth;
  view.spec_cuts_ignored = !spec.split_points.empty() || spec.num_stages || spec.policy != partitioner::Policy::kNone;
  view.nodes = describeNodes(model, split);
  view.manifest = std::move(split.stages.manifest);
  view.manifest.source = path;
  return view;
}

}  // namespace pipeforge::inspect
