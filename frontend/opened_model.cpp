#include "frontend/opened_model.h"

#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/script.h>

#include <unordered_map>
#include <unordered_set>

#include "frontend/module_paths.h"
#include "frontend/pipe_split_op.h"

namespace pipeforge::frontend {
namespace {

using torch::jit::Block;
using torch::jit::Function;
using torch::jit::GraphFunction;
using torch::jit::Node;

GraphFunction* calleeOf(const Node* node) {
  if (node->kind() == c10::prim::CallMethod) {
    auto cls = node->input(0)->type()->cast<c10::ClassType>();
    if (!cls) return nullptr;
    Function* fn = cls->findMethod(node->s(c10::attr::name));
    return fn ? torch::jit::tryToGraphFunction(*fn) : nullptr;
  }
  if (node->kind() == c10::prim::CallFunction) {
    auto fn_type = node->input(0)->type()->cast<c10::FunctionType>();
    return fn_type ? torch::jit::tryToGraphFunction(*fn_type->function()) : nullptr;
  }
  return nullptr;
}

// Answers "does this function (transitively) reach a pipe_split marker?" and
// "does it call submodules?", memoised per function.
class CalleeFacts {
 public:
  bool reachesMarker(GraphFunction* fn) { return facts(fn).marker; }
  bool callsModules(GraphFunction* fn) { return facts(fn).calls_modules; }

 private:
  struct Facts {
    bool marker = false;
    bool calls_modules = false;
  };

  Facts facts(GraphFunction* fn) {
    auto it = memo_.find(fn);
    if (it != memo_.end()) return it->second;
    memo_[fn] = Facts{};  // breaks recursion cycles
    Facts f;
    scan(fn->graph()->block(), f);
    memo_[fn] = f;
    return f;
  }

  void scan(const Block* block, Facts& f) {
    for (const Node* n : block->nodes()) {
      if (isPipeSplitMarker(n)) f.marker = true;
      if (n->kind() == c10::prim::CallMethod) f.calls_modules = true;
      if (GraphFunction* callee = calleeOf(n)) f.marker = f.marker || facts(callee).marker;
      for (const Block* b : n->blocks()) scan(b, f);
    }
  }

  std::unordered_map<GraphFunction*, Facts> memo_;
};

void collectNodes(Block* block, std::vector<Node*>& out) {
  for (Node* n : block->nodes()) {
    out.push_back(n);
    for (Block* b : n->blocks()) collectNodes(b, out);
  }
}

}  // namespace

bool isPipeSplitMarker(const torch::jit::Node* node) {
  return node->kind().toQualString() == std::string(kPipeSplitOpName);
}

struct OpenedModel::Impl {
  torch::jit::Module module;
  std::shared_ptr<torch::jit::Graph> graph;
  std::unordered_map<const Node*, std::string> owner;
  // How many opened calls a node sits inside (absent: 0, the root's own code).
  std::unordered_map<const Node*, int> call_depth;
  bool deeper_calls = false;
  std::string root_owner;
};

OpenedModel::OpenedModel(const torch::jit::Module& module, const OpenOptions& options)
    : impl_(std::make_unique<Impl>()) {
  ensurePipeSplitRegistered();
  impl_->module = module;
  impl_->graph = module.get_method("forward").graph()->copy();
  CalleeFacts facts;

  auto shouldOpen = [&](Node* n) -> std::optional<std::string> {
    GraphFunction* callee = calleeOf(n);
    if (!callee) return std::nullopt;
    if (n->kind() == c10::prim::CallFunction) {
      // Free functions are kept whole unless they hide a marker (python's pipe_split()).
      if (options.open_all || facts.reachesMarker(callee)) {
        return impl_->owner.count(n) ? impl_->owner[n] : std::string();
      }
      return std::nullopt;
    }
    auto fqn = attributePath(n->input(0));
    if (!fqn) return std::nullopt;
    if (fqn->empty() || options.open_all) return fqn;  // the root's own helper methods (resnet's _forward_impl)
    for (const auto& split : options.split_fqns) {
      if (split != *fqn && isWithin(split, *fqn)) return fqn;  // a proper ancestor
    }
    if (facts.reachesMarker(callee)) return fqn;
    if (facts.callsModules(callee)) {
      auto depth = impl_->call_depth.find(n);
      if ((depth == impl_->call_depth.end() ? 0 : depth->second) < options.open_depth) return fqn;
      impl_->deeper_calls = true;
    }
    return std::nullopt;
  };

  // Open one call at a time until nothing more qualifies; each pass rescans
  // because inlining adds nodes that may qualify themselves.
  while (true) {
    impl_->deeper_calls = false;
    std::vector<Node*> nodes;
    collectNodes(impl_->graph->block(), nodes);
    Node* target = nullptr;
    std::string owner;
    for (Node* n : nodes) {
      if (auto o = shouldOpen(n)) {
        target = n;
        owner = *o;
        break;
      }
    }
    if (!target) break;
    auto depth_it = impl_->call_depth.find(target);
    int inner_depth = (depth_it == impl_->call_depth.end() ? 0 : depth_it->second) + 1;
    Node* before = target->prev();
    Node* after = target->next();
    GraphFunction* callee = calleeOf(target);
    // A function call's first input is the function itself, not an argument.
    if (target->kind() == c10::prim::CallFunction) target->removeInput(0);
    torch::jit::inlineCallTo(target, callee, /*use_graph=*/false);
    // The inlined nodes sit between `before` and `after` in the same block.
    for (Node* n = before->next(); n != after; n = n->next()) {
      std::vector<Node*> inner{n};
      for (Block* b : n->blocks()) collectNodes(b, inner);
      for (Node* m : inner) {
        impl_->owner[m] = owner;
        impl_->call_depth[m] = inner_depth;
      }
    }
  }
  if (options.open_all) {
    // Scripted helpers branch on constant flags (F.relu's `inplace`): fold
    // them, so only the ops that run remain. A node the pass made has no
    // owner yet: it takes the one of the node before it.
    std::vector<Node*> before;
    collectNodes(impl_->graph->block(), before);
    const std::unordered_set<Node*> existing(before.begin(), before.end());
    torch::jit::ConstantPropagationImmutableTypes(impl_->graph);
    std::vector<Node*> nodes;
    collectNodes(impl_->graph->block(), nodes);
    std::string last = impl_->root_owner;
    for (Node* n : nodes) {
      auto it = impl_->owner.find(n);
      if (!existing.count(n)) {
        impl_->owner[n] = last;
      } else {
        last = it == impl_->owner.end() ? impl_->root_owner : it->second;
      }
    }
  }
}

OpenedModel::~OpenedModel() = default;
OpenedModel::OpenedModel(OpenedModel&&) noexcept = default;
OpenedModel& OpenedModel::operator=(OpenedModel&&) noexcept = default;

const torch::jit::Module& OpenedModel::module() const { return impl_->module; }
torch::jit::Graph& OpenedModel::graph() const { return *impl_->graph; }
bool OpenedModel::hasDeeperCalls() const { return impl_->deeper_calls; }

const std::string& OpenedModel::ownerOf(const torch::jit::Node* node) const {
  auto it = impl_->owner.find(node);
  return it == impl_->owner.end() ? impl_->root_owner : it->second;
}

}  // namespace pipeforge::frontend
