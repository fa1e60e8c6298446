#include "frontend/pt2_import.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/runtime/operator.h>
#include <torch/script.h>
#include <torch/version.h>

#include <limits>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include "common/error.h"
#include "frontend/module_paths.h"
#include "frontend/pipe_split_op.h"
#include "frontend/pt2_archive.h"
#include "frontend/pt2_arguments.h"
#include "frontend/pt2_graph_values.h"
#include "frontend/pt2_higher_order.h"
#include "frontend/pt2_module_tree.h"
#include "frontend/pt2_names.h"
#include "frontend/pt2_operators.h"
#include "frontend/pt2_regions.h"
#include "frontend/region_ops.h"

// Note [PT2 as nested TorchScript]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The rest of Pipeforge (OpenedModel, the DAG, the partitioner, the stage
// builder, inspect, the runtime) works on a torch::jit::Module whose forward
// calls submodules by prim::CallMethod and reads parameters by prim::GetAttr
// chains from `self`. An exported program is one flat ATen graph whose nodes
// carry `nn_module_stack` (the module calls they ran inside) and whose
// parameters are lifted to placeholders. We rebuild the first from the second:
//
//   PT2 nodes (nn_module_stack)          rebuilt module
//   linear   [blocks.0, blocks.0.fc]     Root.forward(self, x):
//   relu     [blocks.0]                    %b = GetAttr[blocks](%self); %b0 = GetAttr[0](%b)
//   linear_1 [blocks.0, blocks.0.fc2]      %h = CallMethod[forward](%b0, %x)
//                                        blocks.0.forward(self, x):
//                                          %fc = GetAttr[fc](%self); %l = CallMethod[forward](%fc, %x)
//                                          %r = aten::relu(%l) ...
//                                        blocks.0.fc.forward(self, x):
//                                          %w = GetAttr[weight](%self); aten::linear(%x, %w, %bias)
//
// Each maximal run of nodes inside one module call (one nn_module_stack key)
// becomes a method of that module: its arguments are the values the run reads
// from outside, its results the values read after it. Parameters and buffers
// are read with GetAttr when they live inside the called module (or a tied
// alias does: the GPT head reads `lm_head.weight`, the embedding `wte.weight`,
// one tensor), else they are passed in like any other value. ATen nodes become
// TorchScript builtin calls of the same operator (TorchScript's registry holds
// every dispatcher op with the same schema); pippy's and our pipe_split both
// become our marker op. torch.cond becomes a prim::If and while_loop a
// prim::Loop, whose bodies stay whole inside one stage like any scripted `if`
// or loop; a subgraph that reads one submodule's parameters is made a method
// of that submodule, so a split point there is refused as "inside a loop or
// if body". In the functional (ATEN) IR, a buffer_mutation output is written
// back with aten::copy_ right after the node that computes it, in the call
// that owns the buffer (the training IR updates buffers in place already).
//
// Why not a dispatcher interpreter over the exported graph: the splitter,
// stage writer and runtime would each need a second code path for a second IR,
// stage files would stop being loadable with torch.jit.load, and opening calls
// to any depth (a split at `blocks.0.attn`) would have to be re-implemented on
// nn_module_stack. Rebuilding keeps all of that unchanged; the cost is this
// file, and only what TorchScript can express imports (higher-order ops other
// than cond and while_loop are refused by name).

namespace pipeforge::frontend {
namespace {

// Ordered: weights keep the file's order (nlohmann::json would sort the keys).
using json = nlohmann::ordered_json;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

bool operatorExists(const Pt2OpName& op) {
  std::string overload = op.overload == "default" ? "" : op.overload;
  if (c10::Dispatcher::singleton().findSchema({op.qualified(), overload})) return true;
  for (const auto& candidate : torch::jit::getAllOperatorsFor(c10::Symbol::fromQualString(op.qualified()))) {
    if (candidate->schema().overload_name() == overload) return true;
  }
  return false;
}

// Where a graph is being written: the method's module and its value names.
struct Scope {
  Graph* graph = nullptr;
  Value* self = nullptr;
  std::string path;  // FQN of the module whose method this is
  std::unordered_map<std::string, Value*> env;
  bool top_level = true;  // names of the exported graph's placeholders resolve here
};

// An input of a higher-order op's subgraph: an export value by name, or a
// value already made (a loop-carried value inside the loop body).
struct Operand {
  std::string name;
  Value* value = nullptr;
};

class Importer {
 public:
  explicit Importer(const Pt2Archive& archive) : archive_(archive), graph_(archive.graphJson()) {}

  torch::jit::Module run() {
    ensurePipeSplitRegistered();
    ensureRegionOpsRegistered();
    checkOperators();
    checkSignature();
    buildModules();
    buildRegions();
    emitRoot();
    return tree_->root();
  }

 private:
  [[noreturn]] void fail(const std::string& message) const { throw Pt2Error(located(message)); }

  // A message with the file named first, also for the helpers that throw
  // Pt2Error themselves (pt2Int, pt2Int64).
  std::string located(const std::string& message) const { return "'" + archive_.path() + "': " + message; }

  // --- checks ---------------------------------------------------------------

  // Note [Python-only custom ops]: an op registered with torch.library in
  // Python (transformers' MoE layers call transformers::grouped_mm_fallback on
  // CPU) has no kernel in LibTorch, so no stage could run it. It is refused
  // when the model is read, which `pipeforge train` does before any rank
  // starts, naming the export-side fix where one is known.
  void checkOperators() const {
    std::set<std::string> missing = missingPt2Operators(graph_, operatorExists);
    if (!missing.empty()) fail(missingOperatorsMessage(missing, TORCH_VERSION));
  }

  // What each graph value is (pt2_graph_values.h).
  void checkSignature() {
    values_ = readPt2GraphValues(archive_.signature(), archive_.path(),
                                 [this](const std::string& fqn) { archive_.stored(fqn); });
  }

  // --- module tree ----------------------------------------------------------

  // The modules whose methods the graph is written into (pt2_module_tree.h).
  void buildModules() {
    try {
      tree_.emplace(archive_);
    } catch (Pt2Error& e) {
      e.addContext("'" + archive_.path() + "'");
      throw;
    }
    values_.aliases = tree_->tiedNames();
  }

  // --- regions --------------------------------------------------------------

  // Which nodes become which module's method (pt2_regions.h).
  void buildRegions() {
    try {
      regions_ = groupPt2Regions(graph_, archive_.nodes(), values_);
    } catch (Pt2Error& e) {
      e.addContext("'" + archive_.path() + "'");
      throw;
    }
  }

  // --- emission -------------------------------------------------------------

  Value* attributeChain(Scope& scope, const std::string& relative) {
    Value* v = scope.self;
    for (const auto& part : pathParts(relative)) v = scope.graph->insertGetAttr(v, part);
    return v;
  }

  Value* resolve(Scope& scope, const std::string& name) {
    auto it = scope.env.find(name);
    if (it != scope.env.end()) return it->second;
    if (scope.top_level) {
      auto fqn = values_.placeholder_fqn.find(name);
      if (fqn != values_.placeholder_fqn.end()) {
        auto alias = reachableAlias(values_, fqn->second, scope.path);
        if (alias) {
          Value* v = attributeChain(scope, relativePath(*alias, scope.path));
          scope.env[name] = v;
          return v;
        }
      }
    }
    if (scope.top_level && isPt2FloatingSize(graph_, regions_.def_pos, name)) {
      // Note [Symbolic sizes are recomputed, not returned]: computed again here.
      emitNode(scope, graph_.at("nodes").at(regions_.def_pos.at(name)));
      auto made = scope.env.find(name);
      if (made != scope.env.end()) return made->second;
    }
    // Reachable from a malformed archive (the fuzzer found one), so it is the
    // archive's fault, not ours: a documented Pt2Error, not a failed check.
    fail("value '" + name + "' is read before any node of the program defines it; the archive's graph is "
         "malformed: re-export the model with torch.export.save");
  }

  // An Argument as a TorchScript value (constants inserted where needed).
  Value* argument(Scope& scope, const json& arg, const std::string& where) {
    Pt2ArgumentScope reading{scope.graph, [this, &scope](const std::string& name) { return resolve(scope, name); },
                             archive_.path()};
    return readPt2Argument(reading, arg, where);
  }

  // Names the PT2 outputs of `node` on the values TorchScript produced.
  void bindOutputs(Scope& scope, const json& node, Value* result, const std::string& where) {
    const json& outputs = node.at("outputs");
    if (outputs.empty()) {
      // A no-result op (an assert): schema matching packs its nothing into `()`.
      Node* packed = result ? result->node() : nullptr;
      if (packed && packed->kind() == c10::prim::TupleConstruct && packed->inputs().empty() && !result->hasUses()) {
        packed->destroy();
      }
      return;
    }
    auto bind = [&](const json& out, Value* v) {
      std::vector<std::string> names;
      pt2ValueNames(out, names);
      if (out.contains("as_tensors")) {
        auto* unpack = scope.graph->insertNode(scope.graph->createListUnpack(v, names.size()));
        for (size_t i = 0; i < names.size(); ++i) {
          unpack->output(i)->setDebugName(pt2Identifier(names[i]));
          scope.env[names[i]] = unpack->output(i);
        }
        return;
      }
      if (names.empty()) return;  // as_none
      v->setDebugName(pt2Identifier(names[0]));
      scope.env[names[0]] = v;
    };
    if (outputs.size() == 1) {
      bind(outputs[0], result);
      return;
    }
    Node* tuple = result->node();
    if (tuple->kind() != c10::prim::TupleConstruct || tuple->inputs().size() != outputs.size()) {
      fail(fmt::format("{}: expected {} results, TorchScript's operator returns {}", where, outputs.size(),
                       result->type()->repr_str()));
    }
    std::vector<Value*> parts(tuple->inputs().begin(), tuple->inputs().end());
    if (!result->hasUses()) tuple->destroy();
    for (size_t i = 0; i < outputs.size(); ++i) bind(outputs[i], parts[i]);
  }

  std::string describe(const json& node) const {
    return fmt::format("node '{}' ({})", node.value("name", std::string("?")), node.at("target").get<std::string>());
  }

  void emitNode(Scope& scope, const json& node) {
    std::string target = node.at("target").get<std::string>();
    std::string where = describe(node);
    Graph& g = *scope.graph;
    if (isPt2MarkerTarget(target)) {
      g.insertNode(g.create(c10::Symbol::fromQualString(kPipeSplitOpName), {}, 0));
      return;
    }
    if (target == "torch.ops.higher_order.cond") {
      emitCond(scope, node);
      return;
    }
    if (target == "torch.ops.higher_order.while_loop") {
      emitWhileLoop(scope, node);
      return;
    }
    if (target == "torch.ops.higher_order.wrap_with_set_grad_enabled") {
      emitRegion(scope, node, Pt2RegionKind::kGradMode);
      return;
    }
    if (target == "torch.ops.higher_order.wrap_with_autocast") {
      emitRegion(scope, node, Pt2RegionKind::kAutocast);
      return;
    }
    if (isPt2HigherOrderTarget(target)) fail(unsupportedHigherOrderMessage(node, where));
    std::string symbol;
    std::vector<torch::jit::NamedValue> args;
    std::vector<torch::jit::NamedValue> kwargs;
    if (auto op = parsePt2OpTarget(target)) {
      symbol = op->qualified();
      // By name: export leaves out arguments equal to their default, so
      // positions are not reliable; schema matching fills the defaults.
      for (const auto& in : node.at("inputs")) {
        kwargs.emplace_back(in.at("name").get<std::string>(), argument(scope, in.at("arg"), where));
      }
    } else if (auto sym = pt2SymbolicOps().find(target); sym != pt2SymbolicOps().end()) {
      symbol = sym->second;
      for (const auto& in : node.at("inputs")) args.emplace_back(argument(scope, in.at("arg"), where));
    } else {
      fail(fmt::format("{}: the call target '{}' has no TorchScript equivalent here; export without it", where,
                       target));
    }
    Value* result = nullptr;
    try {
      result = g.insert(c10::Symbol::fromQualString(symbol), args, kwargs);
    } catch (const std::exception& e) {
      std::string what = e.what();
      fail(fmt::format("{}: TorchScript has no overload of {} for these arguments: {}", where, symbol,
                       what.substr(0, what.find('\n'))));
    }
    bindOutputs(scope, node, result, where);
  }

  // The deepest module, inside the current one, that owns every parameter
  // and buffer among `names` (the branch's lifted operands); nullopt if none.
  std::optional<std::string> commonOwner(const std::vector<std::string>& names, const std::string& within) const {
    std::optional<std::string> common;
    for (const auto& n : names) {
      auto fqn = values_.placeholder_fqn.find(n);
      if (fqn == values_.placeholder_fqn.end()) continue;
      std::string owner = splitPath(fqn->second).first;
      if (!common) {
        common = owner;
        continue;
      }
      while (!isWithin(owner, *common)) *common = splitPath(*common).first;
    }
    if (!common || common->empty() || !isWithin(*common, within) || *common == within) return std::nullopt;
    return common;
  }

  // Writes `subgraph` (a cond branch) reading `operand_names` of the scope;
  // returns its results in `scope`.
  std::vector<Value*> emitBranch(Scope& scope, const json& subgraph, const std::vector<Operand>& operands,
                                 const std::string& method_base, const std::string& where) {
    const json& inputs = subgraph.at("inputs");
    if (inputs.size() != operands.size()) {
      fail(fmt::format("{}: a subgraph takes {} inputs but the op passes {}", where, inputs.size(), operands.size()));
    }
    // Every branch receives every operand of the cond (both branches' lifted
    // parameters); ownership is decided by the operands this branch reads.
    std::set<std::string> used;
    for (const auto& node : subgraph.at("nodes")) {
      for (const auto& u : pt2NodeUses(node)) used.insert(u);
    }
    std::vector<std::string> branch_outputs;
    pt2ValueNames(subgraph.at("outputs"), branch_outputs);
    used.insert(branch_outputs.begin(), branch_outputs.end());
    std::vector<std::string> sub_names;
    std::vector<std::string> used_operands;
    for (size_t i = 0; i < operands.size(); ++i) {
      std::vector<std::string> names;
      pt2ValueNames(inputs[i], names);
      if (names.size() != 1) fail(where + ": a subgraph input is not a single value");
      sub_names.push_back(names[0]);
      if (used.count(names[0]) && !operands[i].value) used_operands.push_back(operands[i].name);
    }
    auto owner = commonOwner(used_operands, scope.path);
    Scope inner;
    std::vector<Value*> call_args;
    std::shared_ptr<Graph> method_graph;
    if (owner) {
      method_graph = std::make_shared<Graph>();
      inner.graph = method_graph.get();
      inner.path = *owner;
      inner.self = method_graph->addInput("self");
      inner.self->setType(tree_->typeOf(*owner));
    } else {
      inner.graph = scope.graph;
      inner.path = scope.path;
      inner.self = scope.self;
    }
    inner.top_level = false;
    for (size_t i = 0; i < operands.size(); ++i) {
      const std::string& sub_name = sub_names[i];
      if (!used.count(sub_name)) continue;
      const Operand& operand = operands[i];
      auto fqn = operand.value ? values_.placeholder_fqn.end() : values_.placeholder_fqn.find(operand.name);
      if (owner && fqn != values_.placeholder_fqn.end()) {
        if (auto alias = reachableAlias(values_, fqn->second, *owner)) {
          inner.env[sub_name] = attributeChain(inner, relativePath(*alias, *owner));
          continue;
        }
      }
      Value* outer_value = operand.value ? operand.value : resolve(scope, operand.name);
      if (owner) {
        Value* in = method_graph->addInput(pt2Identifier(sub_name));
        in->setType(outer_value->type());
        inner.env[sub_name] = in;
        call_args.push_back(outer_value);
      } else {
        inner.env[sub_name] = outer_value;
      }
    }
    for (const auto& node : subgraph.at("nodes")) emitNode(inner, node);
    std::vector<Value*> results;
    for (const auto& out : subgraph.at("outputs")) results.push_back(argument(inner, out, where));
    if (!owner) return results;

    // The subgraph as a method of its owner, called from inside the if / loop body.
    Value* ret = results.size() == 1 ? results[0]
                                     : method_graph->insertNode(method_graph->createTuple(results))->output();
    method_graph->registerOutput(ret);
    std::string method = tree_->defineMethod(*owner, method_base, method_graph);
    std::vector<Value*> call_inputs{attributeChain(scope, relativePath(*owner, scope.path))};
    call_inputs.insert(call_inputs.end(), call_args.begin(), call_args.end());
    return callMethod(scope, call_inputs, method, ret->type(), results.size());
  }

  void emitCond(Scope& scope, const json& node) {
    std::string where = describe(node);
    const json& inputs = node.at("inputs");
    if (inputs.size() != 4) fail(where + ": expected cond(pred, true_fn, false_fn, operands)");
    Graph& g = *scope.graph;
    Value* pred = toBool(scope, argument(scope, inputs[0].at("arg"), where));
    std::vector<std::string> operand_names;
    pt2ValueNames(inputs[3].at("arg"), operand_names);
    std::vector<Operand> operands;
    for (const auto& name : operand_names) operands.push_back({name, nullptr});

    size_t num_outputs = node.at("outputs").size();
    Node* if_node = g.insertNode(g.create(c10::prim::If, {pred}, num_outputs));
    std::vector<c10::TypePtr> types(num_outputs);
    for (int branch = 1; branch <= 2; ++branch) {
      torch::jit::Block* block = if_node->addBlock();
      torch::jit::WithInsertPoint guard(block);
      Scope body = scope;  // values made in the body stay in the body
      auto results =
          emitBranch(body, inputs[branch].at("arg").at("as_graph").at("graph"), operands, "pt2_cond_branch", where);
      if (results.size() != num_outputs) fail(where + ": a branch returns a different number of values");
      for (size_t i = 0; i < results.size(); ++i) {
        block->registerOutput(results[i]);
        types[i] = results[i]->type();
      }
    }
    for (size_t i = 0; i < num_outputs; ++i) if_node->output(i)->setType(types[i]);
    const json& outputs = node.at("outputs");
    for (size_t i = 0; i < num_outputs; ++i) {
      std::vector<std::string> names;
      pt2ValueNames(outputs[i], names);
      if (names.size() != 1) continue;
      if_node->output(i)->setDebugName(pt2Identifier(names[0]));
      scope.env[names[0]] = if_node->output(i);
    }
  }

  // Note [PT2 regions]
  // ~~~~~~~~~~~~~~~~~~
  // `with torch.no_grad()` (transformers computes rotary embeddings under
  // it) and `with torch.autocast(...)` stay in the training IR as the
  // higher-order ops wrap_with_set_grad_enabled(enable, body, *operands) and
  // wrap_with_autocast(device_type, dtype, enabled, cache_enabled, body,
  // *operands). Each becomes a prim::If on a constant true whose first block
  // sets the mode, runs the body and puts the mode back:
  //
  //   %out = prim::If(%true)   # pf_pt2_region = "a torch.no_grad() region of model.rotary_emb (...)"
  //     block0():
  //       %prev = aten::is_grad_enabled()
  //       = aten::set_grad_enabled(%false)
  //       ... the body ...
  //       = aten::set_grad_enabled(%prev)
  //       -> (%cos, %sin)
  //     block1():               # never taken
  //       -> (prim::Uninitialized, ...)
  //
  // The block is what keeps the region whole: the DAG makes one vertex of a
  // node with blocks, so no cut and no policy can land between the mode
  // change and its undoing, and a split point at a module the body calls is
  // refused naming the region (partitioner/partition.cpp). The runtime runs
  // the block as written; gradients flow through an autocast region and stop
  // at a no-grad one exactly as in eager PyTorch, because the same thread
  // state is set around the same ops. Stage files copy the original
  // higher-order node (Note [PT2 stage files]), so they load in PyTorch as is.

  void emitRegion(Scope& scope, const json& node, Pt2RegionKind kind) {
    std::string where = describe(node);
    const json& inputs = node.at("inputs");
    const size_t body_at = pt2RegionBodyInput(kind);
    if (inputs.size() <= body_at || !inputs[body_at].at("arg").contains("as_graph")) {
      fail(where + (kind == Pt2RegionKind::kGradMode
                        ? ": expected wrap_with_set_grad_enabled(enable, body, *operands)"
                        : ": expected wrap_with_autocast(device_type, dtype, enabled, cache_enabled, body, *operands)"));
    }
    std::vector<Operand> operands;
    for (size_t i = body_at + 1; i < inputs.size(); ++i) {
      std::vector<std::string> names;
      pt2ValueNames(inputs[i].at("arg"), names);
      if (names.size() != 1) fail(where + ": a region operand is not a single value");
      operands.push_back({names[0], nullptr});
    }
    Graph& g = *scope.graph;
    const size_t num_outputs = node.at("outputs").size();
    Node* region = g.insertNode(g.create(c10::prim::If, {g.insertConstant(true)}, num_outputs));
    region->s_(c10::Symbol::attr(kPt2RegionAttribute), describePt2Region(node, kind, scope.path));
    std::vector<c10::TypePtr> types(num_outputs);
    {
      torch::jit::Block* body = region->addBlock();
      torch::jit::WithInsertPoint guard(body);
      Scope inner = scope;  // values made in the region stay in it
      std::function<void()> leave;
      if (kind == Pt2RegionKind::kGradMode) {
        Value* enable = argument(inner, inputs[0].at("arg"), where);
        Value* previous = g.insert(c10::Symbol::fromQualString("aten::is_grad_enabled"), {});
        insertStatement(g, "aten::set_grad_enabled", {enable});
        leave = [&g, previous] { insertStatement(g, "aten::set_grad_enabled", {previous}); };
      } else {
        Value* device = argument(inner, inputs[0].at("arg"), where);
        Value* dtype = argument(inner, inputs[1].at("arg"), where);
        Value* enabled = argument(inner, inputs[2].at("arg"), where);
        Value* cache = argument(inner, inputs[3].at("arg"), where);
        Value* previous = g.insert(c10::Symbol::fromQualString(kAutocastEnterOpName), {device, dtype, enabled, cache});
        leave = [&g, device, previous] { insertStatement(g, kAutocastExitOpName, {device, previous}); };
      }
      auto results = emitBranch(inner, inputs[body_at].at("arg").at("as_graph").at("graph"), operands,
                                kind == Pt2RegionKind::kGradMode ? "pt2_grad_region" : "pt2_autocast_region", where);
      leave();
      if (results.size() != num_outputs) {
        fail(fmt::format("{}: the region returns {} values but the node has {} outputs", where, results.size(),
                         num_outputs));
      }
      for (size_t i = 0; i < num_outputs; ++i) {
        body->registerOutput(results[i]);
        types[i] = results[i]->type();
      }
    }
    {
      torch::jit::Block* never = region->addBlock();
      torch::jit::WithInsertPoint guard(never);
      for (size_t i = 0; i < num_outputs; ++i) {
        Node* u = g.insertNode(g.create(c10::prim::Uninitialized, {}, 1));
        u->output()->setType(types[i]);
        never->registerOutput(u->output());
      }
    }
    const json& outputs = node.at("outputs");
    for (size_t i = 0; i < num_outputs; ++i) {
      region->output(i)->setType(types[i]);
      std::vector<std::string> names;
      pt2ValueNames(outputs[i], names);
      if (names.size() != 1) continue;
      region->output(i)->setDebugName(pt2Identifier(names[0]));
      scope.env[names[0]] = region->output(i);
    }
  }

  // A call of an op that returns nothing: schema matching packs its nothing
  // into an empty tuple, which is dropped.
  static void insertStatement(Graph& g, const char* op, std::vector<torch::jit::NamedValue> args) {
    Value* packed = g.insert(c10::Symbol::fromQualString(op), args);
    Node* n = packed ? packed->node() : nullptr;
    if (n && n->kind() == c10::prim::TupleConstruct && n->inputs().empty() && !packed->hasUses()) n->destroy();
  }

  Value* toBool(Scope& scope, Value* v) {
    return v->type()->cast<c10::TensorType>() ? scope.graph->insert(c10::aten::Bool, {v}) : v;
  }

  // while_loop(cond_fn, body_fn, carried, additional) as a prim::Loop:
  //   %c0 = cond(carried, additional)
  //   %out... = prim::Loop(INT64_MAX, %c0, carried...)
  //     block(%i, %h...): %new... = body(%h..., additional); -> (cond(%new..., additional), %new...)
  void emitWhileLoop(Scope& scope, const json& node) {
    std::string where = describe(node);
    const json& inputs = node.at("inputs");
    if (inputs.size() != 4) fail(where + ": expected while_loop(cond_fn, body_fn, carried_inputs, additional_inputs)");
    const json& cond_graph = inputs[0].at("arg").at("as_graph").at("graph");
    const json& body_graph = inputs[1].at("arg").at("as_graph").at("graph");
    std::vector<std::string> carried_names;
    std::vector<std::string> additional_names;
    pt2ValueNames(inputs[2].at("arg"), carried_names);
    pt2ValueNames(inputs[3].at("arg"), additional_names);
    std::vector<Operand> first;
    for (const auto& n : carried_names) first.push_back({n, nullptr});
    for (const auto& n : additional_names) first.push_back({n, nullptr});
    Graph& g = *scope.graph;
    Value* start = toBool(scope, loopCondition(emitBranch(scope, cond_graph, first, "pt2_while_cond", where), where));
    std::vector<Value*> loop_inputs{g.insertConstant(std::numeric_limits<int64_t>::max()), start};
    for (const auto& n : carried_names) loop_inputs.push_back(resolve(scope, n));
    Node* loop = g.insertNode(g.create(c10::prim::Loop, loop_inputs, carried_names.size()));
    torch::jit::Block* body = loop->addBlock();
    body->addInput()->setType(c10::IntType::get());
    std::vector<Operand> step;
    for (size_t i = 0; i < carried_names.size(); ++i) {
      Value* h = body->addInput(pt2Identifier(carried_names[i]) + "_loop");
      h->setType(loop_inputs[i + 2]->type());
      step.push_back({"", h});
    }
    for (const auto& n : additional_names) step.push_back({n, nullptr});
    {
      torch::jit::WithInsertPoint guard(body);
      Scope inner = scope;
      auto next = emitBranch(inner, body_graph, step, "pt2_while_body", where);
      if (next.size() != carried_names.size()) fail(where + ": the body returns a different number of values");
      std::vector<Operand> again;
      for (Value* v : next) again.push_back({"", v});
      for (const auto& n : additional_names) again.push_back({n, nullptr});
      Value* more = toBool(inner, loopCondition(emitBranch(inner, cond_graph, again, "pt2_while_cond", where), where));
      body->registerOutput(more);
      for (Value* v : next) body->registerOutput(v);
    }
    const json& outputs = node.at("outputs");
    for (size_t i = 0; i < carried_names.size(); ++i) {
      loop->output(i)->setType(loop_inputs[i + 2]->type());
      if (i >= outputs.size()) continue;
      std::vector<std::string> names;
      pt2ValueNames(outputs[i], names);
      if (names.size() != 1) continue;
      loop->output(i)->setDebugName(pt2Identifier(names[0]));
      scope.env[names[0]] = loop->output(i);
    }
  }

  Value* loopCondition(const std::vector<Value*>& results, const std::string& where) const {
    if (results.size() != 1) {
      fail(fmt::format("{}: the loop condition returns {} values, expected one (a bool)", where, results.size()));
    }
    return results[0];
  }

  std::vector<Value*> callMethod(Scope& scope, const std::vector<Value*>& inputs, const std::string& method,
                                 const c10::TypePtr& ret, size_t num_results) {
    Graph& g = *scope.graph;
    Node* call = g.insertNode(g.create(c10::prim::CallMethod, inputs, 1));
    call->s_(c10::attr::name, method);
    call->output()->setType(ret);
    if (num_results == 1) return {call->output()};
    if (num_results == 0) return {};
    Node* unpack = g.insertNode(g.createTupleUnpack(call->output()));
    return {unpack->outputs().begin(), unpack->outputs().end()};
  }

  void emitItems(Scope& scope, const Pt2Region& region) {
    const json& graph_nodes = graph_.at("nodes");
    for (const auto& [is_region, index] : region.items) {
      if (is_region) {
        emitCall(scope, regions_.regions[index]);
        continue;
      }
      const json& node = graph_nodes.at(index);
      Node* end = scope.graph->insertPoint();
      Node* before = end->prev();
      emitNode(scope, node);
      auto writes = regions_.writes.find(index);
      if (writes != regions_.writes.end()) {
        for (const auto& write : writes->second) {
          // Functional IR: the new buffer value is written back in place.
          Value* buffer = resolve(scope, write.buffer);
          scope.graph->insert(c10::aten::copy_, {buffer, resolve(scope, write.value)});
        }
      }
      torch::jit::SourceRange range = sourceRangeOf(node);
      for (Node* n = before->next(); n != end; n = n->next()) {
        tagWithPt2Node(n, index);
        setSourceRange(n, range);
      }
    }
  }

  // Where the Python code made `node`, as a TorchScript source range, so that
  // the split's messages say "aten::mul at modeling_llama.py:391" as they do
  // for scripted code. One Source per file and line.
  torch::jit::SourceRange sourceRangeOf(const json& node) {
    Pt2SourceLocation where = pt2SourceLocation(node);
    if (where.file.empty() || where.line <= 0) return {};
    std::string key = where.file + ":" + std::to_string(where.line);
    auto it = sources_.find(key);
    if (it == sources_.end()) {
      std::string text = where.code.empty() ? std::string(" ") : where.code;
      auto source = std::make_shared<torch::jit::Source>(text, where.file, static_cast<size_t>(where.line));
      it = sources_.emplace(key, source).first;
    }
    return torch::jit::SourceRange(it->second, 0, it->second->size());
  }

  static void setSourceRange(Node* n, const torch::jit::SourceRange& range) {
    if (!range.source()) return;
    n->setSourceRange(range);
    for (torch::jit::Block* b : n->blocks()) {
      for (Node* inner : b->nodes()) setSourceRange(inner, range);
    }
  }

  // Note [PT2 node tags]: every TorchScript node emitted for top-level graph
  // node `index` (blocks included) carries attribute kPt2NodeAttribute = index.
  // Attributes survive createClone and inlining, so after a split the stage
  // writer knows which exported node each stage computes.
  static void tagWithPt2Node(Node* n, int index) {
    n->i_(c10::Symbol::attr(kPt2NodeAttribute), index);
    for (torch::jit::Block* b : n->blocks()) {
      for (Node* inner : b->nodes()) tagWithPt2Node(inner, index);
    }
  }

  void emitCall(Scope& scope, const Pt2Region& region) {
    auto graph = std::make_shared<Graph>();
    Scope inner;
    inner.graph = graph.get();
    inner.path = region.path;
    inner.self = graph->addInput("self");
    inner.self->setType(tree_->typeOf(region.path));
    std::vector<Value*> call_inputs{attributeChain(scope, relativePath(region.path, scope.path))};
    for (const auto& name : region.inputs) {
      Value* outer = resolve(scope, name);
      Value* in = graph->addInput(pt2Identifier(name));
      in->setType(outer->type());
      inner.env[name] = in;
      call_inputs.push_back(outer);
    }
    emitItems(inner, region);
    std::vector<Value*> results;
    for (const auto& name : region.outputs) results.push_back(resolve(inner, name));
    Value* ret = nullptr;
    if (results.empty()) {
      ret = graph->insertConstant(c10::IValue());
    } else if (results.size() == 1) {
      ret = results[0];
    } else {
      ret = graph->insertNode(graph->createTuple(results))->output();
    }
    graph->registerOutput(ret);
    std::string method = tree_->defineMethod(region.path, "forward", graph);
    auto values = callMethod(scope, call_inputs, method, ret->type(), results.size());
    for (size_t i = 0; i < region.outputs.size(); ++i) {
      values[i]->setDebugName(pt2Identifier(region.outputs[i]));
      scope.env[region.outputs[i]] = values[i];
    }
  }

  void emitRoot() {
    auto graph = std::make_shared<Graph>();
    Scope scope;
    scope.graph = graph.get();
    scope.path = "";
    scope.self = graph->addInput("self");
    scope.self->setType(tree_->typeOf(""));
    for (const auto& name : values_.user_inputs) {
      Value* in = graph->addInput(pt2Identifier(name));
      const json& tensors = graph_.at("tensor_values");
      if (tensors.contains(name)) {
        in->setType(c10::TensorType::get());
      } else if (graph_.contains("sym_int_values") && graph_.at("sym_int_values").contains(name)) {
        in->setType(c10::IntType::get());
      } else if (graph_.contains("sym_bool_values") && graph_.at("sym_bool_values").contains(name)) {
        in->setType(c10::BoolType::get());
      } else if (graph_.contains("sym_float_values") && graph_.at("sym_float_values").contains(name)) {
        in->setType(c10::FloatType::get());
      } else {
        in->setType(c10::TensorType::get());
      }
      scope.env[name] = in;
    }
    emitItems(scope, regions_.regions[0]);
    std::vector<Value*> outs;
    for (const auto& name : values_.user_outputs) outs.push_back(resolve(scope, name));
    if (outs.size() == 1 && !returnsTuple()) {
      graph->registerOutput(outs[0]);
    } else {
      graph->registerOutput(graph->insertNode(graph->createTuple(outs))->output());
    }
    tree_->defineMethod("", "forward", graph);
  }

  // Whether forward's output treespec is a tuple (a stage file's `(y,)`), so
  // one output still comes back as a tuple, as from the stage that wrote it.
  bool returnsTuple() const {
    const json& program = archive_.programJson();
    const json& calls = program.at("graph_module").value("module_call_graph", json::array());
    if (calls.empty() || !calls[0].contains("signature") || !calls[0].at("signature").is_object()) return false;
    const json& out_spec = calls[0].at("signature").value("out_spec", json());
    if (!out_spec.is_string()) return false;
    json spec = json::parse(out_spec.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    return spec.is_array() && spec.size() == 2 && spec[1].is_object() && spec[1].value("type", json()) == "builtins.tuple";
  }

  const Pt2Archive& archive_;
  const json& graph_;
  std::optional<Pt2ModuleTree> tree_;
  Pt2GraphValues values_;
  Pt2Regions regions_;
  std::map<std::string, std::shared_ptr<torch::jit::Source>> sources_;  // "file:line" -> its Source
};

}  // namespace

torch::jit::Module importPt2(const Pt2Archive& archive) {
  try {
    return Importer(archive).run();
  } catch (const nlohmann::ordered_json::exception& e) {
    throw Pt2Error(fmt::format("'{}': the exported graph does not have the expected structure ({}); re-export the "
                               "model with torch {}",
                               archive.path(), e.what(), TORCH_VERSION));
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    throw Pt2Error(fmt::format("'{}': cannot rebuild the exported graph: {}", archive.path(),
                               what.substr(0, what.find('\n'))));
  }
}

torch::jit::Module loadPt2Model(const std::string& path) { return importPt2(Pt2Archive::open(path)); }

}  // namespace pipeforge::frontend
