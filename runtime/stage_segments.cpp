#include "runtime/stage_segments.h"

#include <map>
#include <set>

#include <fmt/format.h>
#include <torch/script.h>

#include "common/error.h"
#include "frontend/model_dag.h"
#include "frontend/opened_model.h"
#include "partitioner/partition.h"
#include "runtime/errors.h"
#include "stage/build_stages.h"

namespace pipeforge::runtime {

// Note [Checkpointing every k-th call]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// `activation_checkpointing: {every_n: k}` recomputes the k-th, 2k-th, ...
// submodule call of each stage's forward (counted within the stage, in
// forward order, as `pipeforge inspect` lists the stage's calls) and keeps
// the graph of everything else, as torchtitan's "checkpoint every k-th
// block": memory and recompute time both fall to about 1/k of `full`'s.
//
// At load time the stage's forward is cut, with the same frontend, DAG and
// stage builder that split the model, into a chain of segments: each chosen
// call alone, and the code between chosen calls. The segment modules are
// the stage's own submodule objects, so they hold the very tensors the
// optimizer steps and checkpoints save; nothing is copied. The stage then
// runs the chain itself (PipelineStage, Note [Running a segmented stage]).
StageSegments cutAtCalls(const torch::jit::Module& stage_module, int stage_index, int every_n,
                         std::vector<torch::jit::Module>& segments) {
  StageSegments out;
  segments.clear();
  try {
    frontend::OpenedModel opened(stage_module, frontend::OpenOptions{});
    frontend::ModelDag dag = frontend::buildDag(opened);
    const std::size_t n = boost::num_vertices(dag.graph);
    std::vector<std::size_t> chosen;
    int calls = 0;
    for (std::size_t v = 0; v < n; ++v) {
      if (dag.graph[v].kind != frontend::DagNodeKind::kCall) continue;
      if (++calls % every_n == 0) chosen.push_back(v);
    }
    if (chosen.empty()) return out;  // fewer than k calls: nothing to recompute here

    // Vertex ranges [start, next start): a chosen call alone, and the code
    // around it. Ranges without work (constants only) join the one before.
    auto does_work = [&](std::size_t v) {
      auto kind = dag.graph[v].kind;
      return kind == frontend::DagNodeKind::kOp || kind == frontend::DagNodeKind::kCall ||
             kind == frontend::DagNodeKind::kControlFlow;
    };
    std::set<std::size_t> cuts{1};
    for (std::size_t v : chosen) {
      cuts.insert(v);
      cuts.insert(v + 1);
    }
    std::vector<std::size_t> starts;
    for (std::size_t start : cuts) {
      std::size_t end = n - 1;  // the outputs vertex ends the last range
      auto next = cuts.upper_bound(start);
      if (next != cuts.end()) end = std::min(end, *next);
      bool work = false;
      for (std::size_t v = start; v < end; ++v) work = work || does_work(v);
      if (work || starts.empty()) starts.push_back(start);
    }
    partitioner::Partition partition = partitioner::partitionAtStarts(dag, starts);
    std::set<std::size_t> chosen_set(chosen.begin(), chosen.end());
    for (std::size_t seg = 0; seg < starts.size(); ++seg) {
      std::size_t end = seg + 1 < starts.size() ? starts[seg + 1] : n - 1;
      bool alone = end == starts[seg] + 1 && chosen_set.count(starts[seg]);
      out.checkpointed.push_back(alone);
      std::string what;
      for (std::size_t v = starts[seg]; v < end; ++v) {
        if (dag.graph[v].kind != frontend::DagNodeKind::kCall) continue;
        what += (what.empty() ? "" : ", ") + dag.graph[v].callee;
      }
      out.calls.push_back(what.empty() ? "(no calls)" : what);
    }

    stage::BuiltStages built = stage::buildStages(opened, dag, partition);
    segments = std::move(built.modules);
    out.dataflow = std::move(built.manifest);
  } catch (const std::exception& e) {
    throw RuntimeError(fmt::format(
        "stage {}: pipeline.activation_checkpointing.every_n {} needs the stage cut at its submodule calls, and "
        "that failed: {}; use activation_checkpointing: full (the whole stage is recomputed) instead",
        stage_index, every_n, e.what()));
  }

  // The segments must hold the stage's own tensors: the optimizer and the
  // checkpoints see only those.
  std::map<std::string, const c10::TensorImpl*> own;
  for (const auto& p : stage_module.named_parameters(true)) own.emplace(p.name, p.value.unsafeGetTensorImpl());
  for (const auto& b : stage_module.named_buffers(true)) own.emplace(b.name, b.value.unsafeGetTensorImpl());
  for (std::size_t j = 0; j < segments.size(); ++j) {
    auto check = [&](const std::string& name, const at::Tensor& t) {
      auto it = own.find(name);
      if (it == own.end() || it->second != t.unsafeGetTensorImpl()) {
        PIPEFORGE_FAIL(fmt::format("stage {}: segment {} holds its own copy of '{}'; segments must share "
                                   "the stage's tensors",
                                   stage_index, j, name));
      }
    };
    for (const auto& p : segments[j].named_parameters(true)) check(p.name, p.value);
    for (const auto& b : segments[j].named_buffers(true)) check(b.name, b.value);
    segments[j].train(stage_module.is_training());
  }
  return out;
}

}  // namespace pipeforge::runtime
