#include "partitioner/partition.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <set>

#include "common/error.h"
#include "frontend/module_paths.h"

namespace pipeforge::partitioner {
namespace {

using frontend::DagNode;
using frontend::DagNodeKind;

bool belongsTo(const DagNode& d, const std::string& fqn) {
  if (d.kind == DagNodeKind::kCall && frontend::isWithin(d.callee, fqn)) return true;
  return d.kind != DagNodeKind::kInputs && d.kind != DagNodeKind::kOutputs && frontend::isWithin(d.owner, fqn);
}

bool isWork(const DagNode& d) {
  return d.kind == DagNodeKind::kOp || d.kind == DagNodeKind::kCall || d.kind == DagNodeKind::kControlFlow;
}

size_t numVertices(const frontend::ModelDag& dag) { return boost::num_vertices(dag.graph); }

// Moves a cut forward to the next vertex that does work, so cuts separated
// only by markers collapse into one.
size_t normalizeCut(const frontend::ModelDag& dag, size_t cut) {
  while (cut < numVertices(dag) && !isWork(dag.graph[cut]) && dag.graph[cut].kind != DagNodeKind::kOutputs) ++cut;
  return cut;
}

size_t firstWorkVertex(const frontend::ModelDag& dag) { return normalizeCut(dag, 1); }

// Minimises the largest stage weight over contiguous groupings of units
// into `stages` stages, never letting a stage span a forced boundary. Ties
// on the largest weight go to the smaller sum of squares (more even stages).
std::vector<size_t> balanceUnits(const std::vector<double>& weight, const std::vector<bool>& forced_start,
                                 int stages) {
  const size_t n = weight.size();
  const double inf = std::numeric_limits<double>::infinity();
  struct Score {
    double max = std::numeric_limits<double>::infinity();
    double squares = 0.0;
    bool betterThan(const Score& o) const {
      if (o.max == std::numeric_limits<double>::infinity()) return max < o.max;
      const double eps = 1e-9 * std::max(1.0, std::abs(o.max));
      if (max < o.max - eps) return true;
      return max <= o.max + eps && squares < o.squares - 1e-12 * std::max(1.0, o.squares);
    }
  };
  std::vector<double> prefix(n + 1, 0.0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + weight[i];
  // best[k][i]: best score placing units [0, i) into k stages.
  std::vector<std::vector<Score>> best(stages + 1, std::vector<Score>(n + 1));
  std::vector<std::vector<size_t>> from(stages + 1, std::vector<size_t>(n + 1, 0));
  best[0][0] = Score{0.0, 0.0};
  for (int k = 1; k <= stages; ++k) {
    for (size_t i = 1; i <= n; ++i) {
      // Stage k covers units [j, i); no forced start strictly inside.
      for (size_t j = i; j-- > 0;) {
        if (best[k - 1][j].max < inf) {
          double w = prefix[i] - prefix[j];
          Score candidate{std::max(best[k - 1][j].max, w), best[k - 1][j].squares + w * w};
          if (candidate.betterThan(best[k][i])) {
            best[k][i] = candidate;
            from[k][i] = j;
          }
        }
        if (forced_start[j]) break;
      }
    }
  }
  if (best[stages][n].max == inf) return {};
  std::vector<size_t> starts;
  for (size_t i = n, k = stages; k > 0; --k) {
    i = from[k][i];
    starts.push_back(i);
  }
  std::reverse(starts.begin(), starts.end());
  return starts;
}

}  // namespace

PolicyUnits policyUnits(const frontend::ModelDag& dag) {
  PolicyUnits units;
  size_t first = firstWorkVertex(dag);
  units.starts.push_back(first);
  // The ops before the first call (GPT's arange for positions) join the first
  // call's unit: a stage of bookkeeping alone would be a wasted pipeline step.
  bool seen_call = dag.graph[first].kind == DagNodeKind::kCall;
  for (size_t v = first + 1; v < numVertices(dag); ++v) {
    if (dag.graph[v].kind != DagNodeKind::kCall) continue;
    if (seen_call) units.starts.push_back(v);
    seen_call = true;
  }
  return units;
}

std::vector<size_t> explicitCuts(const frontend::ModelDag& dag, const SplitSpec& spec,
                                 const std::vector<std::string>& module_paths,
                                 const std::vector<ControlFlowPath>& control_flow_paths) {
  std::set<size_t> cuts;
  for (const auto& [fqn, point] : spec.split_points) {
    if (std::find(module_paths.begin(), module_paths.end(), fqn) == module_paths.end()) {
      auto near = frontend::nearestNames(fqn, module_paths);
      throw SpecError(fmt::format("split point '{}': no submodule with this name; nearest: {}", fqn,
                                  fmt::join(near, ", ")));
    }
    bool found = false;
    // Each maximal run of vertices belonging to the module is one invocation.
    for (size_t v = 1; v + 1 < numVertices(dag); ++v) {
      if (!belongsTo(dag.graph[v], fqn)) continue;
      size_t end = v;
      while (end + 1 < numVertices(dag) && (belongsTo(dag.graph[end + 1], fqn) || !isWork(dag.graph[end + 1])) &&
             dag.graph[end + 1].kind != DagNodeKind::kOutputs) {
        ++end;
      }
      while (end > v && !belongsTo(dag.graph[end], fqn)) --end;
      cuts.insert(point == SplitPoint::kBeginning ? v : end + 1);
      found = true;
      v = end;
    }
    if (found) continue;
    for (const auto& inside : control_flow_paths) {
      if (frontend::isWithin(inside.fqn, fqn) || frontend::isWithin(fqn, inside.fqn)) {
        throw SpecError(fmt::format(
            "split point '{}' is inside {}; such a region stays whole in one stage, so split before or after "
            "the statement that holds it",
            fqn, inside.inside));
      }
    }
    throw SpecError(fmt::format("split point '{}': forward never calls this module; split at a module that runs", fqn));
  }
  for (size_t v = 0; v < numVertices(dag); ++v) {
    if (dag.graph[v].kind == DagNodeKind::kMarker) cuts.insert(v);
  }
  std::set<size_t> normalized;
  for (size_t c : cuts) normalized.insert(normalizeCut(dag, c));
  return {normalized.begin(), normalized.end()};
}

Partition partitionDag(const frontend::ModelDag& dag, const SplitSpec& spec, const std::vector<size_t>& cuts,
                       const std::vector<double>& unit_costs) {
  const size_t n = numVertices(dag);
  const size_t first = firstWorkVertex(dag);
  const size_t outputs = n - 1;
  for (size_t c : cuts) {
    if (c <= first) {
      throw SpecError("the spec yields an empty stage 0: a split point or marker comes before any work of forward; "
                      "remove it or move it later");
    }
    if (c >= outputs) {
      throw SpecError("the spec yields an empty last stage: a split point or marker comes after the last work of "
                      "forward; remove it or move it earlier");
    }
  }
  std::vector<size_t> starts{first};
  starts.insert(starts.end(), cuts.begin(), cuts.end());
  Partition partition;

  if (spec.policy == Policy::kNone) {
    if (cuts.empty()) {
      throw SpecError("the spec gives no split: add split_points, pipe_split() markers in forward, or "
                      "num_stages with a policy (parameters, cost, uniform)");
    }
    if (spec.num_stages && *spec.num_stages != static_cast<int>(starts.size())) {
      throw SpecError(fmt::format("split points and markers give {} stages but num_stages is {}; add a policy to "
                                  "place the remaining cuts, or drop num_stages",
                                  starts.size(), *spec.num_stages));
    }
  } else {
    const int stages = *spec.num_stages;
    PolicyUnits units = policyUnits(dag);
    // Explicit cuts split units too, so they can be forced boundaries.
    std::set<size_t> unit_set(units.starts.begin(), units.starts.end());
    unit_set.insert(cuts.begin(), cuts.end());
    std::vector<size_t> unit_starts(unit_set.begin(), unit_set.end());
    if (static_cast<int>(unit_starts.size()) < stages) {
      throw SpecError(fmt::format("{} stages asked for, but the model has only {} cut points at its deepest "
                                  "submodule level; use at most {} stages",
                                  stages, unit_starts.size() - 1, unit_starts.size()));
    }
    if (static_cast<int>(starts.size()) > stages) {
      throw SpecError(fmt::format("split points and markers already give {} stages, more than num_stages {}",
                                  starts.size(), stages));
    }
    std::vector<double> weight(unit_starts.size(), 0.0);
    std::vector<bool> forced(unit_starts.size(), false);
    for (size_t u = 0; u < unit_starts.size(); ++u) {
      size_t end = u + 1 < unit_starts.size() ? unit_starts[u + 1] : outputs;
      forced[u] = std::find(cuts.begin(), cuts.end(), unit_starts[u]) != cuts.end();
      switch (spec.policy) {
        case Policy::kParameters: {
          std::set<std::string> names;
          for (size_t v = unit_starts[u]; v < end; ++v) names.insert(dag.graph[v].parameters.begin(), dag.graph[v].parameters.end());
          for (const auto& name : names) weight[u] += static_cast<double>(dag.tensor_bytes.at(name));
          break;
        }
        case Policy::kUniform:
          for (size_t v = unit_starts[u]; v < end; ++v) weight[u] += dag.graph[v].kind == DagNodeKind::kCall ? 1.0 : 0.0;
          break;
        case Policy::kCost:
          PIPEFORGE_CHECK(unit_costs.size() == unit_starts.size(), "cost policy needs one measured cost per unit");
          weight[u] = unit_costs[u];
          break;
        case Policy::kNone:
          break;
      }
    }
    forced[0] = true;
    auto chosen = balanceUnits(weight, forced, stages);
    if (chosen.empty()) {
      throw SpecError(fmt::format("cannot place {} stages around the fixed split points; use more or fewer stages", stages));
    }
    starts.clear();
    std::vector<double> stage_weight(stages, 0.0);
    for (int k = 0; k < stages; ++k) {
      starts.push_back(unit_starts[chosen[k]]);
      size_t stop = k + 1 < stages ? chosen[k + 1] : unit_starts.size();
      for (size_t u = chosen[k]; u < stop; ++u) stage_weight[k] += weight[u];
    }
    double mean = std::accumulate(stage_weight.begin(), stage_weight.end(), 0.0) / stages;
    double max = *std::max_element(stage_weight.begin(), stage_weight.end());
    partition.imbalance = mean > 0 ? max / mean : 1.0;
    partition.balance = fmt::format("policy {}: {} stages, max/mean {:.3f} (per-stage weights: {:.4g})",
                                    policyName(spec.policy), stages, mean > 0 ? max / mean : 1.0,
                                    fmt::join(stage_weight, ", "));
  }

  Partition ranges = partitionAtStarts(dag, starts);
  partition.num_stages = ranges.num_stages;
  partition.stage_of_vertex = std::move(ranges.stage_of_vertex);
  return partition;
}

Partition partitionAtStarts(const frontend::ModelDag& dag, const std::vector<size_t>& starts) {
  const size_t n = numVertices(dag);
  Partition partition;
  partition.num_stages = static_cast<int>(starts.size());
  partition.stage_of_vertex.assign(n, 0);
  int stage = 0;
  for (size_t v = 0; v < n; ++v) {
    while (stage + 1 < partition.num_stages && v >= starts[stage + 1]) ++stage;
    partition.stage_of_vertex[v] = stage;
  }
  partition.stage_of_vertex[n - 1] = partition.num_stages - 1;
  return partition;
}

}  // namespace pipeforge::partitioner
