#include "stage/build_stages.h"

#include <fmt/format.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/script.h>

#include <algorithm>
#include <cctype>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>

#include "frontend/graph_reads.h"
#include "stage/value_meta.h"
#include "frontend/model_dag.h"
#include "frontend/module_paths.h"
#include "frontend/opened_model.h"
#include "stage/changed_state_check.h"
#include "stage/stage_plan.h"

namespace pipeforge::stage {
namespace {

using torch::jit::Block;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

// Note [Stage signatures]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A stage input that is an argument of the model keeps that argument's name
// and default value, so a stage file reads like the model where it takes the
// model's arguments: `forward(self, x: Tensor, mask: Optional[Tensor]=None)`,
// and stage0(x) in Python passes mask None as model(x) does. (Non-tensor
// arguments such as `scale: float=2.` are no stage inputs: the split bakes
// them in, Note [Constant inputs].) Inputs from earlier stages keep their
// generated `in<i>_...` names.
// The graph's input names are what a saved file prints, the schema holds the
// defaults: both are set.
void keepModelArguments(torch::jit::Module& stage, Graph& graph, const torch::jit::Module& model,
                        const std::vector<ValueSource>& sources) {
  const c10::FunctionSchema& original = model.get_method("forward").function().getSchema();
  torch::jit::Function& fn = stage.get_method("forward").function();
  std::vector<c10::Argument> args = fn.getSchema().arguments();
  std::set<std::string> taken;
  for (const auto& a : args) taken.insert(a.name());
  for (size_t i = 0; i < sources.size() && i + 1 < args.size(); ++i) {
    if (sources[i].kind != ValueSource::Kind::kInput) continue;
    const auto k = static_cast<size_t>(sources[i].index) + 1;
    if (k >= original.arguments().size()) continue;
    const c10::Argument& from = original.arguments()[k];
    c10::Argument& to = args[i + 1];
    std::string name = to.name();
    if (!taken.count(from.name())) {
      taken.erase(name);
      name = from.name();
      taken.insert(name);
      graph.inputs()[i + 1]->setDebugName(name);
    }
    to = c10::Argument(name, to.type(), to.N(), from.default_value(), to.kwarg_only());
  }
  fn.setSchema(fn.getSchema().cloneWithArguments(std::move(args)));
}

std::string sanitizeTypeName(const std::string& path) {
  std::string out;
  for (char c : path) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return out;
}

std::string describeValue(const Value* v) {
  return fmt::format("%{} ({})", v->debugName(), v->type()->repr_str());
}

// The value stage `k` sends for `sent`, built at the end of its graph, after
// everything the stage does: a tensor, `list[i]`, `dict[key]`, or a copy of
// an attribute (a copy, so later forwards changing the buffer in place do
// not change what this microbatch sent).
Value* sentValue(Graph& g, const Sent& sent, const std::unordered_map<const Value*, Value*>& env, Value* self, int k) {
  auto local = [&](const Value* v) {
    auto it = env.find(v);
    PIPEFORGE_CHECK(it != env.end(), fmt::format("stage {} sends {} which it does not hold", k, describeValue(v)));
    return it->second;
  };
  switch (sent.kind) {
    case Sent::Kind::kValue:
      return local(sent.value);
    case Sent::Kind::kListElement:
      return g.insert(c10::aten::__getitem__, {local(sent.value), g.insertConstant(sent.index)});
    case Sent::Kind::kDictValue:
      return g.insert(c10::aten::__getitem__, {local(sent.value), g.insertConstant(*torch::jit::toIValue(sent.key))});
    case Sent::Kind::kAttribute: {
      Value* v = self;
      size_t start = 0;
      while (true) {
        size_t dot = sent.fqn.find('.', start);
        v = g.insertGetAttr(v, sent.fqn.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
        if (dot == std::string::npos) break;
        start = dot + 1;
      }
      return g.insert(c10::aten::clone, {v});
    }
  }
  PIPEFORGE_FAIL("unknown kind of sent value");
}

// Stage `k`'s graph: its inputs (`self` first, typed as the model), the
// containers it rebuilds, a clone of every node it emits (and of the
// constants and attribute reads those need), and a tuple of what it sends;
// dead code removed.
std::shared_ptr<Graph> lowerStage(Graph& graph, const StagePlan& stage, int k) {
  const StageDataflow& flow = stage.flow;
  auto g = std::make_shared<Graph>();
  std::unordered_map<const Value*, Value*> env;
  Value* self = g->addInput("self");
  self->setType(graph.inputs()[0]->type());
  env[graph.inputs()[0]] = self;

  std::vector<Value*> inputs;
  for (size_t i = 0; i < flow.inputs.size(); ++i) {
    const StageInputPlan& in = flow.inputs[i];
    Value* value = g->addInput(stage.input_names[i]);
    switch (in.what.kind) {
      case Sent::Kind::kValue:
        value->setType(in.what.value->type());
        break;
      case Sent::Kind::kAttribute:
        value->setType(in.binds.front()->type());
        break;
      case Sent::Kind::kListElement:
      case Sent::Kind::kDictValue:
        value->setType(c10::TensorType::get());
        break;
    }
    for (const Value* b : in.binds) env[b] = value;
    inputs.push_back(value);
  }
  for (const RebuiltContainer& c : flow.containers) {
    std::vector<Value*> elements;
    for (int e : c.elements) elements.push_back(inputs.at(e));
    Node* rebuilt = nullptr;
    if (c.is_dict) {
      std::vector<Value*> keys;
      for (const Value* key : c.keys) keys.push_back(g->insertConstant(*torch::jit::toIValue(key)));
      auto type = c.names.front()->type()->expect<c10::DictType>();
      rebuilt = g->insertNode(g->createDict(type->getKeyType(), type->getValueType(), keys, elements));
    } else {
      auto type = c.names.front()->type()->expect<c10::ListType>();
      rebuilt = g->insertNode(g->createList(type->getElementType(), elements));
    }
    for (const Value* name : c.names) env[name] = rebuilt->output();
  }

  // A value the stage neither computes nor receives is a constant or an
  // attribute read: cloned where first needed.
  std::function<Value*(Value*)> lookup = [&](Value* v) -> Value* {
    auto it = env.find(v);
    if (it != env.end()) return it->second;
    Node* producer = v->node();
    PIPEFORGE_CHECK(frontend::isFreeNode(producer), "stage " + std::to_string(k) + " reads " + describeValue(v) +
                                                        " which it neither computes nor receives");
    Node* clone = g->insertNode(g->createClone(producer, lookup));
    for (size_t i = 0; i < producer->outputs().size(); ++i) env[producer->outputs()[i]] = clone->outputs()[i];
    return env.at(v);
  };

  for (const Node* n : flow.emit) {
    Node* clone = g->createClone(const_cast<Node*>(n), lookup);
    g->insertNode(clone);
    for (size_t i = 0; i < n->outputs().size(); ++i) env[n->outputs()[i]] = clone->outputs()[i];
  }
  std::vector<Value*> outs;
  for (const Sent& sent : flow.outputs) outs.push_back(sentValue(*g, sent, env, self, k));
  g->registerOutput(g->insertNode(g->createTuple(outs))->output());
  torch::jit::EliminateDeadCode(g);
  return g;
}

// Gives every module-valued read of `block` the type of the module it now
// reads: the model's own module inside a whole one, else the stage's container.
void retypeModuleReads(Block* block, const torch::jit::Module& original, const std::vector<std::string>& whole,
                       const std::map<std::string, torch::jit::Module>& containers) {
  for (Node* n : block->nodes()) {
    if (n->kind() == c10::prim::GetAttr && n->output()->type()->cast<c10::ClassType>()) {
      if (auto path = frontend::attributePath(n->output())) {
        bool in_whole = std::any_of(whole.begin(), whole.end(),
                                    [&](const std::string& w) { return frontend::isWithin(*path, w); });
        n->output()->setType(in_whole ? frontend::submoduleAt(original, *path).type() : containers.at(*path).type());
      }
    }
    for (Block* b : n->blocks()) retypeModuleReads(b, original, whole, containers);
  }
}

// Stage `k`'s module: the tree `layout` describes (Note [Stage module trees])
// around `graph` as its forward.
torch::jit::Module assembleStageModule(const torch::jit::Module& original, int k, const StageModules& layout,
                                       const std::shared_ptr<Graph>& graph) {
  auto cu = original._ivalue()->compilation_unit();
  torch::jit::Module root(c10::QualifiedName(fmt::format("__torch__.pipeforge_split.Stage{}", k)), cu,
                          /*shouldMangle=*/true);
  root.train(original.is_training());
  std::map<std::string, torch::jit::Module> containers{{"", root}};
  std::vector<std::string> whole;
  for (const StageModuleEntry& entry : layout.entries) {
    auto [parent, name] = frontend::splitPath(entry.fqn);
    torch::jit::Module& target = containers.at(parent);
    switch (entry.kind) {
      case StageModuleEntry::Kind::kOpened: {
        torch::jit::Module child(
            c10::QualifiedName(fmt::format("__torch__.pipeforge_split.Stage{}_{}", k, sanitizeTypeName(entry.fqn))),
            cu, /*shouldMangle=*/true);
        child.train(original.is_training());
        target.register_module(name, child);
        containers.emplace(entry.fqn, child);
        break;
      }
      case StageModuleEntry::Kind::kWhole:
        target.register_module(name, frontend::submoduleAt(original, entry.fqn));
        whole.push_back(entry.fqn);
        break;
      case StageModuleEntry::Kind::kParameter:
      case StageModuleEntry::Kind::kBuffer:
      case StageModuleEntry::Kind::kAttribute: {
        torch::jit::Module source = frontend::submoduleAt(original, parent);
        auto type = source.type();
        auto slot = type->getAttributeSlot(name);
        c10::IValue value = source._ivalue()->getSlot(slot);
        if (entry.kind == StageModuleEntry::Kind::kParameter) {
          target.register_parameter(name, value.toTensor(), /*is_buffer=*/false);
        } else if (entry.kind == StageModuleEntry::Kind::kBuffer) {
          target.register_buffer(name, value.toTensor());
        } else {
          target.register_attribute(name, type->getAttribute(slot), value);
        }
        break;
      }
    }
  }
  graph->inputs()[0]->setType(root.type());
  retypeModuleReads(graph->block(), original, whole, containers);
  auto* fn = cu->create_function(c10::QualifiedName(*root.type()->name(), "forward"), graph);
  root.type()->addMethod(fn);
  return root;
}

// Tied: names of one tensor, and any name held by several stages. Unused:
// state forward never reads, so no stage holds it; a name whose tensor
// another held name shares is not unused: it is that tensor.
void noteTiedAndUnused(PipeManifest& manifest, const std::map<std::string, std::set<int>>& holders,
                       const frontend::ModelDag& dag, const torch::jit::Module& model) {
  std::set<std::vector<std::string>> tied;
  std::set<std::string> in_alias_group;
  for (const auto& group : dag.aliases) {
    tied.insert(group);
    in_alias_group.insert(group.begin(), group.end());
  }
  for (const auto& [name, stages] : holders) {
    if (stages.size() > 1 && !in_alias_group.count(name)) tied.insert({name});
  }
  manifest.tied.assign(tied.begin(), tied.end());

  std::set<std::string> shared_with_held;
  for (const auto& group : dag.aliases) {
    bool held = false;
    for (const auto& name : group) held = held || holders.count(name) > 0;
    if (held) shared_with_held.insert(group.begin(), group.end());
  }
  auto note_unused = [&](const std::string& name) {
    if (!holders.count(name) && !shared_with_held.count(name)) manifest.unused.push_back(name);
  };
  for (const auto& p : model.named_parameters(/*recurse=*/true)) note_unused(p.name);
  for (const auto& b : model.named_buffers(/*recurse=*/true)) note_unused(b.name);
}

}  // namespace

BuiltStages::BuiltStages() = default;
BuiltStages::~BuiltStages() = default;
BuiltStages::BuiltStages(BuiltStages&&) noexcept = default;
BuiltStages& BuiltStages::operator=(BuiltStages&&) noexcept = default;

BuiltStages buildStages(const frontend::OpenedModel& model, const frontend::ModelDag& dag,
                        const partitioner::Partition& partition) {
  return buildStagesFromPlan(model, dag, planStages(model, dag, partition));
}

BuiltStages buildStagesFromPlan(const frontend::OpenedModel& model, const frontend::ModelDag& dag,
                                const SplitPlan& plan) {
  const int num_stages = static_cast<int>(plan.stages.size());
  BuiltStages built;
  built.manifest.num_stages = num_stages;
  built.manifest.inputs = plan.model_inputs;
  built.manifest.outputs = plan.model_outputs;

  std::map<std::string, std::set<int>> holders;
  for (int k = 0; k < num_stages; ++k) {
    const StagePlan& stage = plan.stages[k];
    std::shared_ptr<Graph> g = lowerStage(model.graph(), stage, k);
    torch::jit::Module module = assembleStageModule(model.module(), k, planStageModules(model.module(), *g), g);
    StageInfo info;
    info.index = k;
    info.file = fmt::format("stage_{}.pt", k);
    for (const StageInputPlan& in : stage.flow.inputs) info.inputs.push_back(in.source);
    keepModelArguments(module, *g, model.module(), info.inputs);
    info.num_outputs = static_cast<int>(stage.flow.outputs.size());
    for (const auto& p : module.named_parameters(true)) {
      info.parameters.push_back(p.name);
      info.parameter_meta.push_back(tensorMeta(p.value));
      holders[p.name].insert(k);
    }
    for (const auto& b : module.named_buffers(true)) {
      info.buffers.push_back(b.name);
      holders[b.name].insert(k);
    }
    built.modules.push_back(std::move(module));
    built.manifest.stages.push_back(std::move(info));
  }
  checkChangedStateHeldOnce(built.modules);
  noteTiedAndUnused(built.manifest, holders, dag, model.module());
  return built;
}

}  // namespace pipeforge::stage
