#include "runtime/split_backward.h"

#include <unordered_map>
#include <unordered_set>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include "compat/autograd_compat.h"

namespace pipeforge::runtime {
namespace {

using AutogradEdge = torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Engine;
using torch::autograd::Node;
using torch::autograd::variable_list;

struct Seeds {
  edge_list edges;
  variable_list grads;
};

Seeds rootSeeds(const std::vector<at::Tensor>& roots, const std::vector<at::Tensor>& grads) {
  TORCH_CHECK(roots.size() == grads.size(), "backward: ", roots.size(), " roots but ", grads.size(), " gradients");
  Seeds seeds;
  for (std::size_t i = 0; i < roots.size(); ++i) {
    if (!roots[i].defined() || !roots[i].requires_grad() || !grads[i].defined()) continue;
    seeds.edges.push_back(torch::autograd::impl::gradient_edge(roots[i]));
    seeds.grads.push_back(grads[i]);
  }
  return seeds;
}

std::vector<at::Tensor> undefinedGrads(std::size_t n) { return std::vector<at::Tensor>(n); }

// Node flags of the graph below the roots.
enum : std::uint8_t { kVisited = 1, kReachesInput = 2, kReachesParam = 4 };

class GraphScan {
 public:
  GraphScan(const std::unordered_set<Node*>& input_nodes, const std::unordered_set<Node*>& param_nodes)
      : input_nodes_(input_nodes), param_nodes_(param_nodes) {}

  // Post-order walk (iterative: graphs can be thousands of nodes deep).
  std::uint8_t scan(Node* root) {
    struct Frame {
      Node* node;
      std::size_t next;
    };
    std::vector<Frame> stack;
    auto push = [&](Node* n) {
      auto [it, fresh] = flags_.emplace(n, 0);
      if (!fresh) return;
      stack.push_back({n, 0});
    };
    push(root);
    while (!stack.empty()) {
      Frame& top = stack.back();
      const auto& edges = top.node->next_edges();
      if (top.next < edges.size()) {
        Node* child = edges[top.next++].function.get();
        if (child != nullptr) push(child);
        continue;
      }
      std::uint8_t f = kVisited;
      if (input_nodes_.count(top.node)) f |= kReachesInput;
      if (param_nodes_.count(top.node)) f |= kReachesParam;
      for (const AutogradEdge& e : edges) {
        if (e.function) f |= flags_.at(e.function.get()) & (kReachesInput | kReachesParam);
      }
      flags_[top.node] = f;
      stack.pop_back();
    }
    return flags_.at(root);
  }

  bool onInputPath(Node* n) const { return flags_.at(n) & kReachesInput; }
  bool reachesParam(Node* n) const { return flags_.at(n) & kReachesParam; }

  // Parameters reachable from `from` through weight-only nodes.
  void collectParams(Node* from, std::vector<Node*>& out, std::unordered_set<Node*>& seen) const {
    std::vector<Node*> todo{from};
    while (!todo.empty()) {
      Node* n = todo.back();
      todo.pop_back();
      if (!seen.insert(n).second) continue;
      if (param_nodes_.count(n)) out.push_back(n);
      for (const AutogradEdge& e : n->next_edges()) {
        Node* c = e.function.get();
        if (c != nullptr && !onInputPath(c) && reachesParam(c)) todo.push_back(c);
      }
    }
  }

 private:
  const std::unordered_set<Node*>& input_nodes_;
  const std::unordered_set<Node*>& param_nodes_;
  std::unordered_map<Node*, std::uint8_t> flags_;
};

// W: one engine call from every boundary node (with its captured gradient)
// and every root off the input path, after cutting the boundary nodes'
// edges back to the input path (Note [Cutting the input path]).
class EngineWeightWork : public WeightGradWork {
 public:
  edge_list roots;
  variable_list grads;
  edge_list params;
  std::vector<std::pair<compat::AutogradNodePtr, std::size_t>> cuts;  // (boundary node, next-edge index)

  void run() override {
    if (roots.empty() || params.empty()) return;
    // Note [Cutting the input path]: I is done with the input path. Cut off
    // from it, each boundary node reaches only its own weight subgraph, so
    // the call neither walks nor recomputes the input path, and no boundary
    // node's gradient flows into another's (which one call over the intact
    // graph would do, counting the lower node's gradient twice). A weight
    // reached from two boundary nodes gets both contributions in this call.
    for (auto& [node, k] : cuts) const_cast<edge_list&>(node->next_edges())[k] = AutogradEdge();
    Engine::get_default_engine().execute(roots, grads, /*keep_graph=*/false, /*create_graph=*/false,
                                         /*accumulate_grad=*/true, params);
    roots.clear();
    grads.clear();
    cuts.clear();
  }
};

// The gradient edges of the inputs that require grad: what I asks the engine for.
struct InputEdges {
  std::unordered_set<Node*> nodes;
  edge_list edges;
  std::vector<int> slots;  // position in `inputs` of each edge
};

InputEdges inputEdgesOf(const std::vector<at::Tensor>& inputs) {
  InputEdges out;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].requires_grad()) continue;
    AutogradEdge e = torch::autograd::impl::gradient_edge(inputs[i]);
    out.nodes.insert(e.function.get());
    out.edges.push_back(e);
    out.slots.push_back(static_cast<int>(i));
  }
  return out;
}

// The gradient accumulators of the parameters W fills, with owning pointers.
struct ParamNodes {
  std::unordered_set<Node*> nodes;
  std::unordered_map<Node*, compat::AutogradNodePtr> owner;
};

ParamNodes paramNodesOf(const std::vector<at::Tensor>& params) {
  ParamNodes out;
  for (const at::Tensor& p : params) {
    if (!p.requires_grad()) continue;
    if (auto acc = torch::autograd::impl::try_get_grad_accumulator(p)) {
      out.nodes.insert(acc.get());
      out.owner.emplace(acc.get(), acc);
    }
  }
  return out;
}

// Boundary nodes (Note [Split backward]): on the input path, with a weight-only child.
std::vector<compat::AutogradNodePtr> boundaryNodes(const Seeds& seeds, const GraphScan& scan) {
  std::vector<compat::AutogradNodePtr> boundary;
  std::unordered_set<Node*> seen;
  std::vector<compat::AutogradNodePtr> todo;
  for (const AutogradEdge& e : seeds.edges) {
    if (scan.onInputPath(e.function.get())) todo.push_back(e.function);
  }
  while (!todo.empty()) {
    compat::AutogradNodePtr n = todo.back();
    todo.pop_back();
    if (!seen.insert(n.get()).second) continue;
    bool is_boundary = false;
    for (const AutogradEdge& e : n->next_edges()) {
      Node* c = e.function.get();
      if (c == nullptr) continue;
      if (scan.onInputPath(c)) {
        todo.push_back(e.function);
      } else if (scan.reachesParam(c)) {
        is_boundary = true;
      }
    }
    if (is_boundary) boundary.push_back(n);
  }
  return boundary;
}

// Fills W's seeds: the roots off the input path now, and its outputs: every
// parameter they or the boundary nodes reach, and the cuts (Note [Cutting
// the input path]). Returns the boundary nodes' input edges, whose gradients
// I captures as W's other seeds.
edge_list planWeightWork(const Seeds& seeds, const GraphScan& scan,
                         const std::vector<compat::AutogradNodePtr>& boundary, const ParamNodes& param_nodes,
                         EngineWeightWork& weight) {
  std::vector<Node*> found;
  std::unordered_set<Node*> seen;
  for (std::size_t i = 0; i < seeds.edges.size(); ++i) {
    Node* n = seeds.edges[i].function.get();
    if (scan.onInputPath(n) || !scan.reachesParam(n)) continue;
    weight.roots.push_back(seeds.edges[i]);
    weight.grads.push_back(seeds.grads[i]);
    scan.collectParams(n, found, seen);
  }
  edge_list capture_edges;
  for (const auto& n : boundary) {
    seen.insert(n.get());
    const edge_list& edges = n->next_edges();
    for (std::size_t k = 0; k < edges.size(); ++k) {
      Node* c = edges[k].function.get();
      if (c == nullptr) continue;
      if (scan.onInputPath(c)) {
        weight.cuts.emplace_back(n, k);
      } else if (scan.reachesParam(c)) {
        scan.collectParams(c, found, seen);
      }
    }
    for (std::uint32_t k = 0; k < n->num_inputs(); ++k) capture_edges.emplace_back(n, k);
  }
  for (Node* p : found) weight.params.emplace_back(param_nodes.owner.at(p), 0);
  return capture_edges;
}

}  // namespace

std::vector<at::Tensor> backwardFull(const std::vector<at::Tensor>& roots, const std::vector<at::Tensor>& root_grads,
                                     const std::vector<at::Tensor>& inputs) {
  Seeds seeds = rootSeeds(roots, root_grads);
  if (seeds.edges.empty()) return undefinedGrads(inputs.size());
  // As loss.backward(): every leaf below the roots accumulates, the stage's
  // input leaves included; their .grad is the input gradient.
  Engine::get_default_engine().execute(seeds.edges, seeds.grads, /*keep_graph=*/false, /*create_graph=*/false,
                                       /*accumulate_grad=*/true);
  std::vector<at::Tensor> grads;
  grads.reserve(inputs.size());
  for (const at::Tensor& in : inputs) grads.push_back(in.requires_grad() ? in.grad() : at::Tensor());
  return grads;
}

InputGradResult backwardInput(const std::vector<at::Tensor>& roots, const std::vector<at::Tensor>& root_grads,
                              const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& params) {
  InputGradResult result;
  result.input_grads = undefinedGrads(inputs.size());
  Seeds seeds = rootSeeds(roots, root_grads);
  if (seeds.edges.empty()) {
    result.weight = std::make_unique<EngineWeightWork>();
    return result;
  }

  const InputEdges in = inputEdgesOf(inputs);
  const ParamNodes param_nodes = paramNodesOf(params);
  GraphScan scan(in.nodes, param_nodes.nodes);
  for (const AutogradEdge& e : seeds.edges) scan.scan(e.function.get());

  auto weight = std::make_unique<EngineWeightWork>();
  const edge_list capture_edges = planWeightWork(seeds, scan, boundaryNodes(seeds, scan), param_nodes, *weight);

  // With no outputs the engine would run (and accumulate) everything.
  edge_list outputs = in.edges;
  outputs.insert(outputs.end(), capture_edges.begin(), capture_edges.end());
  variable_list got;
  if (!outputs.empty()) {
    got = Engine::get_default_engine().execute(seeds.edges, seeds.grads, /*keep_graph=*/true,
                                               /*create_graph=*/false, /*accumulate_grad=*/false, outputs);
  }
  for (std::size_t i = 0; i < in.edges.size(); ++i) result.input_grads[in.slots[i]] = got[i];
  for (std::size_t j = 0; j < capture_edges.size(); ++j) {
    const at::Tensor& g = got[in.edges.size() + j];
    if (!g.defined()) continue;
    weight->roots.push_back(capture_edges[j]);
    weight->grads.push_back(g);
  }
  result.weight = std::move(weight);
  return result;
}

}  // namespace pipeforge::runtime
