#include "partitioner/policy_search.h"

#include <torch/csrc/jit/ir/ir.h>
#include <torch/script.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <set>
#include <string>

#include "frontend/module_paths.h"
#include "frontend/pt2_import.h"

namespace pipeforge::partitioner {
namespace {

// FQNs whose code sits inside a node with blocks (prim::If / prim::Loop, or
// an exported program's grad-mode or autocast region) of the opened graph,
// each with what the outermost such node is.
std::vector<ControlFlowPath> controlFlowPaths(const frontend::OpenedModel& opened) {
  static const c10::Symbol kRegion = c10::Symbol::attr(frontend::kPt2RegionAttribute);
  std::vector<ControlFlowPath> paths;
  std::function<void(torch::jit::Block*, const std::string*)> walk = [&](torch::jit::Block* block,
                                                                         const std::string* inside) {
    for (torch::jit::Node* n : block->nodes()) {
      if (inside) {
        paths.push_back({opened.ownerOf(n), *inside});
        if (n->kind() == c10::prim::CallMethod) {
          if (auto p = frontend::attributePath(n->input(0))) paths.push_back({*p, *inside});
        }
      }
      if (n->blocks().empty()) continue;
      static const std::string kLoopOrIf = "a loop or if body of forward";
      const std::string* what = inside;
      std::string region;
      if (!what) {
        if (n->hasAttribute(kRegion)) {
          region = n->s(kRegion);
          what = &region;
        } else {
          what = &kLoopOrIf;
        }
      }
      for (torch::jit::Block* b : n->blocks()) walk(b, what);
    }
  };
  walk(opened.graph().block(), nullptr);
  paths.erase(std::remove_if(paths.begin(), paths.end(), [](const ControlFlowPath& p) { return p.fqn.empty(); }),
              paths.end());
  return paths;
}

// One way to split: the model opened to some depth, its DAG, cuts and partition.
struct Plan {
  frontend::OpenedModel opened;
  frontend::ModelDag dag;
  std::vector<size_t> cuts;
  std::vector<double> costs;
  bool enough_cut_points = true;
  Partition partition;
};

Plan planAt(const torch::jit::Module& model, const SplitSpec& spec, const std::vector<std::string>& module_paths,
            const frontend::OpenOptions& options, const MeasureUnitCosts& measure) {
  frontend::OpenedModel opened(model, options);
  frontend::ModelDag dag = frontend::buildDag(opened);
  auto cuts = explicitCuts(dag, spec, module_paths, controlFlowPaths(opened));
  Plan plan{std::move(opened), std::move(dag), std::move(cuts), {}, true, {}};
  if (spec.policy == Policy::kNone) {
    plan.partition = partitionDag(plan.dag, spec, plan.cuts);
    return plan;
  }
  // Explicit cuts subdivide units (and the cost policy measures at that grain).
  auto units = policyUnits(plan.dag);
  std::set<size_t> starts(units.starts.begin(), units.starts.end());
  starts.insert(plan.cuts.begin(), plan.cuts.end());
  plan.enough_cut_points = static_cast<int>(starts.size()) >= *spec.num_stages;
  if (!plan.enough_cut_points) return plan;
  if (spec.policy == Policy::kCost) plan.costs = measure(plan.opened, plan.dag, {starts.begin(), starts.end()});
  plan.partition = partitionDag(plan.dag, spec, plan.cuts, plan.costs);
  return plan;
}

}  // namespace

// Note [Policy depth search]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Policies balance at the shallowest level of calls that gives enough cut
// points; `parameters` and `cost` go one level deeper while that improves
// the balance by more than 1% (a 2-block GPT in 4 stages needs the blocks'
// children to balance at all). `uniform` stays at the shallowest level.
ChosenPartition searchPartition(const torch::jit::Module& model, const SplitSpec& spec,
                                const MeasureUnitCosts& measure) {
  std::vector<std::string> split_fqns;
  for (const auto& [fqn, point] : spec.split_points) split_fqns.push_back(fqn);
  const auto module_paths = frontend::submodulePaths(model);

  frontend::OpenOptions options;
  options.split_fqns = split_fqns;
  std::optional<Plan> best;
  while (true) {
    Plan plan = planAt(model, spec, module_paths, options, measure);
    bool enough = plan.enough_cut_points;
    bool deeper = plan.opened.hasDeeperCalls();
    if (!enough && deeper) {
      ++options.open_depth;  // not enough cut points at this level: open one level deeper
      continue;
    }
    if (!enough) {
      plan.partition = partitionDag(plan.dag, spec, plan.cuts, plan.costs);  // throws, naming the limit
    }
    if (best && plan.partition.imbalance >= best->partition.imbalance * 0.99) break;
    best = std::move(plan);
    if (spec.policy == Policy::kNone || spec.policy == Policy::kUniform || !deeper || options.open_depth >= 4) break;
    ++options.open_depth;
  }
  return ChosenPartition{std::move(best->opened), std::move(best->dag), std::move(best->partition)};
}

}  // namespace pipeforge::partitioner
