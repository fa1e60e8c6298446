#include "stage/stage_segments.h"

#include <algorithm>
#include <set>

#include <torch/script.h>

#include "frontend/model_dag.h"
#include "frontend/opened_model.h"
#include "partitioner/partition.h"
#include "stage/build_stages.h"

namespace pipeforge::stage {

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
//
// The cutting lives here, with the splitter it reuses; the runtime receives
// it from its caller (runtime::StageCutter) and checks what it gets: that
// the segments share the stage's tensors.
StageSegments cutAtCalls(const torch::jit::Module& stage_module, int every_n,
                         std::vector<torch::jit::Module>& segments) {
  StageSegments out;
  segments.clear();
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

  BuiltStages built = buildStages(opened, dag, partition);
  segments = std::move(built.modules);
  out.dataflow = std::move(built.manifest);
  return out;
}

}  // namespace pipeforge::stage
