#include "frontend/module_mode.h"

#include <fmt/format.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/script.h>

#include <set>

// Note [Ops that follow the mode]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// nn.Dropout and nn.BatchNorm read `self.training` when they run. A graph
// made by torch.export (or torch.jit.trace) ran them once, in the mode the
// model was in, and holds that mode as a constant:
//
//   aten.dropout.default(x, 0.5, True)                        # exported in train mode
//   aten.batch_norm.default(x, w, b, mean, var, True, 0.1, 1e-05, False)
//   aten.add_.Tensor(num_batches_tracked, 1)                  # train mode only
//   aten.scaled_dot_product_attention.default(q, k, v, None, 0.1)   # transformers: p if training else 0
//
// Run as written, a held-out loss of a model exported in train mode has
// dropout in it, and a model exported in eval mode trains without dropout and
// with frozen batch statistics. A stage runs its ops in the mode of what it
// does instead: train mode for training steps, eval mode for the held-out
// loss, `eval` and `generate` (PipelineRunner::evalStep), whatever mode the
// export was traced in. So each constant flag above is replaced by a read of
// the owning module's `training` attribute, which Module::train() sets:
//
//   %training = prim::GetAttr[name="training"](%self)
//   aten::dropout(%x, 0.5, %training)
//   %p = prim::If(%training) -> (0.1) | -> (0.)               # sdpa's dropout_p
//   prim::If(%training) { aten::add_(%num_batches_tracked, 1) }
//
// A batch norm without running statistics (track_running_stats=False) always
// uses the batch's, as in PyTorch, and is left alone; so is a flag that is
// not a constant (a scripted module reads self.training already). An
// sdpa exported in eval mode has no dropout_p left to restore, and a batch
// norm exported in eval mode has no num_batches_tracked increment (it only
// matters for momentum=None). Random ops other than dropout (a decomposed
// dropout's bernoulli, BART's layerdrop rand) cannot be told apart from
// randomness the model wants in evaluation too: they are listed by
// randomOpsIgnoringMode, and the split warns about them.

namespace pipeforge::frontend {
namespace {

using torch::jit::Block;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

// Dropout ops: each takes its train flag third (input 2).
bool isDropout(const Node* node) {
  static const std::set<std::string> kinds = {
      "aten::dropout",       "aten::dropout_",       "aten::feature_dropout",       "aten::feature_dropout_",
      "aten::alpha_dropout", "aten::alpha_dropout_", "aten::feature_alpha_dropout", "aten::feature_alpha_dropout_",
      "aten::native_dropout"};
  return kinds.count(node->kind().toQualString()) > 0;
}

// batch_norm / instance_norm(input, weight, bias, running_mean, running_var, training, ...)
bool isNormWithRunningStats(const Node* node) {
  const std::string kind = node->kind().toQualString();
  if (kind != "aten::batch_norm" && kind != "aten::instance_norm") return false;
  if (node->inputs().size() < 6) return false;
  for (size_t i : {3, 4}) {
    if (node->input(i)->mustBeNone()) return false;
  }
  return true;
}

bool isSdpa(const Node* node) {
  return node->kind().toQualString() == std::string("aten::scaled_dot_product_attention") &&
         node->inputs().size() >= 5;
}

bool isConstantBool(Value* v) {
  auto iv = torch::jit::toIValue(v);
  return iv && iv->isBool();
}

// `aten::add_(<the num_batches_tracked buffer>, 1)` with its result unused.
bool isBatchesTrackedIncrement(const Node* node) {
  if (node->kind().toQualString() != std::string("aten::add_") || node->output()->hasUses()) return false;
  const Node* target = node->input(0)->node();
  return target->kind() == c10::prim::GetAttr && target->s(c10::attr::name) == "num_batches_tracked";
}

class ModeRewriter {
 public:
  explicit ModeRewriter(Graph& graph) : graph_(graph), self_(graph.inputs().at(0)) {}

  int run() {
    visit(graph_.block());
    return rewritten_;
  }

 private:
  // self.training, read right before `node` (so it moves with the node when
  // a stage is cut around it).
  Value* training(Node* node) {
    torch::jit::WithInsertPoint guard(node);
    return graph_.insertGetAttr(self_, "training");
  }

  // prim::If(self.training) -> (on) | -> (off), before `node`.
  Value* whenTraining(Node* node, Value* on, Value* off) {
    Value* t = training(node);
    torch::jit::WithInsertPoint guard(node);
    Node* choice = graph_.insertNode(graph_.create(c10::prim::If, {t}, 1));
    choice->addBlock()->registerOutput(on);
    choice->addBlock()->registerOutput(off);
    choice->output()->setType(on->type());
    return choice->output();
  }

  void visit(Block* block) {
    for (auto it = block->nodes().begin(); it != block->nodes().end();) {
      Node* node = *it;
      ++it;  // the node may move into a block of its own below
      for (Block* inner : node->blocks()) visit(inner);
      if (isDropout(node) && node->inputs().size() >= 3 && isConstantBool(node->input(2))) {
        node->replaceInput(2, training(node));
        ++rewritten_;
      } else if (isNormWithRunningStats(node) && isConstantBool(node->input(5))) {
        node->replaceInput(5, training(node));
        ++rewritten_;
      } else if (isSdpa(node)) {
        auto p = torch::jit::toIValue(node->input(4));
        if (!p || !p->isDouble() || p->toDouble() == 0.0) continue;
        Value* off = nullptr;
        {
          torch::jit::WithInsertPoint guard(node);
          off = graph_.insertConstant(0.0);
        }
        node->replaceInput(4, whenTraining(node, node->input(4), off));
        ++rewritten_;
      } else if (isBatchesTrackedIncrement(node)) {
        Value* t = training(node);
        torch::jit::WithInsertPoint guard(node);
        Node* gate = graph_.insertNode(graph_.create(c10::prim::If, {t}, 0));
        Block* then = gate->addBlock();
        gate->addBlock();
        node->moveBefore(then->return_node());
        ++rewritten_;
      }
    }
  }

  Graph& graph_;
  Value* self_;
  int rewritten_ = 0;
};

bool hasTrainingAttribute(const Graph& graph) {
  if (graph.inputs().empty()) return false;
  auto type = graph.inputs().at(0)->type()->cast<c10::ClassType>();
  return type && type->hasAttribute("training");
}

bool isRandom(const Node* node) {
  static const std::set<std::string> kinds = {
      "aten::rand",      "aten::rand_like",    "aten::randn",   "aten::randn_like", "aten::randint",
      "aten::randint_like", "aten::randperm",  "aten::bernoulli", "aten::bernoulli_", "aten::normal",
      "aten::multinomial", "aten::uniform_",   "aten::normal_", "aten::exponential_", "aten::random_"};
  return kinds.count(node->kind().toQualString()) > 0;
}

void collectRandom(const Block* block, const std::string& path, std::vector<std::string>& out) {
  for (const Node* node : block->nodes()) {
    for (const Block* inner : node->blocks()) collectRandom(inner, path, out);
    if (isRandom(node)) out.push_back(fmt::format("{} ({})", path.empty() ? "(the root module)" : path,
                                                  node->kind().toQualString()));
  }
}

// Each distinct method graph of `module` and its submodules once, with the
// FQN of the first module that holds it (scripted submodules of one class
// share their graphs).
template <typename Fn>
void forEachMethodGraph(const torch::jit::Module& module, Fn fn) {
  std::set<const Graph*> seen;
  for (const auto& entry : module.named_modules()) {
    for (const auto& method : entry.value.get_methods()) {
      std::shared_ptr<Graph> graph = method.graph();
      if (seen.insert(graph.get()).second) fn(entry.name, *graph);
    }
  }
}

}  // namespace

int followModuleMode(torch::jit::Module& module) {
  int rewritten = 0;
  forEachMethodGraph(module, [&](const std::string&, Graph& graph) {
    if (hasTrainingAttribute(graph)) rewritten += ModeRewriter(graph).run();
  });
  return rewritten;
}

std::vector<std::string> randomOpsIgnoringMode(const torch::jit::Module& module) {
  std::vector<std::string> out;
  forEachMethodGraph(module, [&](const std::string& path, Graph& graph) { collectRandom(graph.block(), path, out); });
  return out;
}

}  // namespace pipeforge::frontend
