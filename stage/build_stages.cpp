#include "stage/build_stages.h"

#include <fmt/format.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <unordered_map>

#include "frontend/graph_reads.h"
#include "frontend/module_paths.h"
#include "stage/changed_state_check.h"
#include "stage/stage_dataflow.h"

namespace pipeforge::stage {
namespace {

using torch::jit::Block;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

// A Python-identifier debug name for a stage input (TorchScript archives with
// names like `h0.1_in` fail to load).
std::string identifierFor(const std::string& raw, size_t index) {
  std::string name = "in" + std::to_string(index) + "_";
  for (char c : raw) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return name;
}

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

torch::jit::Module moduleAt(const torch::jit::Module& root, const std::string& path) {
  torch::jit::Module m = root;
  if (path.empty()) return m;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    m = m.attr(part).toModule();
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return m;
}

std::pair<std::string, std::string> splitLast(const std::string& path) {
  auto dot = path.rfind('.');
  if (dot == std::string::npos) return {"", path};
  return {path.substr(0, dot), path.substr(dot + 1)};
}

void collectGetAttrs(Block* block, std::vector<Node*>& out) {
  for (Node* n : block->nodes()) {
    if (n->kind() == c10::prim::GetAttr) out.push_back(n);
    for (Block* b : n->blocks()) collectGetAttrs(b, out);
  }
}

// Assembles one stage's module tree around its graph (see the file comment).
class StageModuleBuilder {
 public:
  StageModuleBuilder(const torch::jit::Module& original, int stage) : original_(original), stage_(stage) {
    cu_ = original._ivalue()->compilation_unit();
    root_ = torch::jit::Module(c10::QualifiedName(fmt::format("__torch__.pipeforge_split.Stage{}", stage)), cu_,
                               /*shouldMangle=*/true);
    root_.train(original.is_training());
    containers_[""] = root_;
  }

  torch::jit::Module finish(std::shared_ptr<Graph> graph) {
    std::vector<Node*> getattrs;
    collectGetAttrs(graph->block(), getattrs);
    std::set<std::string> whole;
    std::set<std::string> attributes;
    for (Node* n : getattrs) {
      auto path = frontend::attributePath(n->output());
      if (!path) continue;
      if (n->output()->type()->cast<c10::ClassType>()) {
        for (const auto& use : n->output()->uses()) {
          if (use.user->kind() != c10::prim::GetAttr) whole.insert(*path);
        }
      } else {
        attributes.insert(*path);
      }
    }
    for (const auto& path : whole) {
      bool covered = std::any_of(whole.begin(), whole.end(),
                                 [&](const std::string& other) { return other != path && frontend::isWithin(path, other); });
      if (covered) continue;
      auto [parent, name] = splitLast(path);
      container(parent).register_module(name, moduleAt(original_, path));
      whole_.insert(path);
    }
    for (const auto& path : attributes) {
      if (isUnderWhole(path)) continue;
      auto [parent, name] = splitLast(path);
      torch::jit::Module source = moduleAt(original_, parent);
      torch::jit::Module target = container(parent);
      if (target.hasattr(name)) continue;
      auto type = source.type();
      auto slot = type->getAttributeSlot(name);
      c10::IValue value = source._ivalue()->getSlot(slot);
      if (type->is_parameter(slot)) {
        target.register_parameter(name, value.toTensor(), /*is_buffer=*/false);
      } else if (type->is_buffer(slot)) {
        target.register_buffer(name, value.toTensor());
      } else {
        target.register_attribute(name, type->getAttribute(slot), value);
      }
    }
    // Retype the module-valued reads to the stage's own containers.
    graph->inputs()[0]->setType(root_.type());
    for (Node* n : getattrs) {
      if (!n->output()->type()->cast<c10::ClassType>()) continue;
      auto path = frontend::attributePath(n->output());
      if (!path) continue;
      n->output()->setType(moduleFor(*path).type());
    }
    auto* fn = cu_->create_function(c10::QualifiedName(*root_.type()->name(), "forward"), graph);
    root_.type()->addMethod(fn);
    return root_;
  }

 private:
  bool isUnderWhole(const std::string& path) const {
    return std::any_of(whole_.begin(), whole_.end(), [&](const std::string& w) { return frontend::isWithin(path, w) && path != w; });
  }

  torch::jit::Module moduleFor(const std::string& path) {
    for (const auto& w : whole_) {
      if (frontend::isWithin(path, w)) return moduleAt(original_, path);
    }
    return container(path);
  }

  torch::jit::Module& container(const std::string& path) {
    auto it = containers_.find(path);
    if (it != containers_.end()) return it->second;
    auto [parent, name] = splitLast(path);
    torch::jit::Module& parent_module = container(parent);
    torch::jit::Module child(
        c10::QualifiedName(fmt::format("__torch__.pipeforge_split.Stage{}_{}", stage_, sanitizeTypeName(path))), cu_,
        /*shouldMangle=*/true);
    child.train(original_.is_training());
    parent_module.register_module(name, child);
    return containers_.emplace(path, child).first->second;
  }

  torch::jit::Module original_;
  int stage_;
  std::shared_ptr<torch::jit::CompilationUnit> cu_;
  torch::jit::Module root_;
  std::map<std::string, torch::jit::Module> containers_;
  std::set<std::string> whole_;
};

std::string describeValue(const Value* v) {
  return fmt::format("%{} ({})", v->debugName(), v->type()->repr_str());
}

// The raw name of a stage input, made an identifier by identifierFor.
std::string inputName(const Sent& what) {
  switch (what.kind) {
    case Sent::Kind::kValue:
      return what.value->debugName();
    case Sent::Kind::kListElement:
      return fmt::format("{}_{}", what.value->debugName(), what.index);
    case Sent::Kind::kDictValue: {
      auto key = torch::jit::toIValue(what.key);
      std::string text = !key ? "key" : key->isString() ? key->toStringRef() : std::to_string(key->toInt());
      return fmt::format("{}_{}", what.value->debugName(), text);
    }
    case Sent::Kind::kAttribute:
      return what.fqn;
  }
  return "value";
}

// The value stage `k` sends for `sent`, built at the end of its graph, after
// everything the stage does: a tensor, `list[i]`, `dict[key]`, or a copy of
// an attribute (a copy, so later forwards changing the buffer in place do
// not change what this microbatch sent).
Value* sentValue(Graph& g, const Sent& sent, const std::unordered_map<const Value*, Value*>& env, Value* self, int k) {
  auto local = [&](const Value* v) {
    auto it = env.find(v);
    if (it == env.end()) {
      throw StageBuildError(fmt::format("internal: stage {} sends {} which it does not hold", k, describeValue(v)));
    }
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
  throw StageBuildError("internal: unknown kind of sent value");
}

}  // namespace

BuiltStages buildStages(const frontend::OpenedModel& model, const frontend::ModelDag& dag,
                        const partitioner::Partition& partition) {
  Graph& graph = model.graph();
  const int num_stages = partition.num_stages;
  // What each stage computes, receives and sends (Note [Mutable state across stages]).
  const DataflowPlan plan = planDataflow(model, dag, partition);

  BuiltStages built;
  built.manifest.num_stages = num_stages;
  built.manifest.inputs = dag.input_names;
  built.manifest.outputs = plan.model_outputs;

  std::map<std::string, std::set<int>> holders;
  for (int k = 0; k < num_stages; ++k) {
    const StageDataflow& flow = plan.stages[k];
    StageInfo info;
    info.index = k;
    info.file = fmt::format("stage_{}.pt", k);
    auto g = std::make_shared<Graph>();
    std::unordered_map<const Value*, Value*> env;
    Value* self = g->addInput("self");
    self->setType(graph.inputs()[0]->type());
    env[graph.inputs()[0]] = self;

    std::vector<Value*> inputs;
    for (size_t i = 0; i < flow.inputs.size(); ++i) {
      const StageInputPlan& in = flow.inputs[i];
      Value* value = g->addInput(identifierFor(inputName(in.what), i));
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
      info.inputs.push_back(in.source);
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

    std::function<Value*(Value*)> lookup = [&](Value* v) -> Value* {
      auto it = env.find(v);
      if (it != env.end()) return it->second;
      Node* producer = v->node();
      if (!frontend::isFreeNode(producer)) {
        throw StageBuildError("internal: stage " + std::to_string(k) + " reads " + describeValue(v) +
                              " which it neither computes nor receives");
      }
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

    StageModuleBuilder builder(model.module(), k);
    torch::jit::Module module = builder.finish(g);
    keepModelArguments(module, *g, model.module(), info.inputs);
    info.num_outputs = static_cast<int>(outs.size());
    for (const auto& p : module.named_parameters(true)) {
      info.parameters.push_back(p.name);
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

  // Tied: names of one tensor, and any name held by several stages.
  std::set<std::vector<std::string>> tied;
  std::set<std::string> in_alias_group;
  for (const auto& group : dag.aliases) {
    tied.insert(group);
    in_alias_group.insert(group.begin(), group.end());
  }
  for (const auto& [name, stages] : holders) {
    if (stages.size() > 1 && !in_alias_group.count(name)) tied.insert({name});
  }
  built.manifest.tied.assign(tied.begin(), tied.end());

  // Unused: state forward never reads, so no stage holds it. A name whose
  // tensor another held name shares is not unused: it is that tensor.
  std::set<std::string> shared_with_held;
  for (const auto& group : dag.aliases) {
    bool held = false;
    for (const auto& name : group) held = held || holders.count(name) > 0;
    if (held) shared_with_held.insert(group.begin(), group.end());
  }
  auto note_unused = [&](const std::string& name) {
    if (!holders.count(name) && !shared_with_held.count(name)) built.manifest.unused.push_back(name);
  };
  for (const auto& p : model.module().named_parameters(/*recurse=*/true)) note_unused(p.name);
  for (const auto& b : model.module().named_buffers(/*recurse=*/true)) note_unused(b.name);
  return built;
}

std::vector<at::Tensor> runChained(std::vector<torch::jit::Module>& modules, const PipeManifest& manifest,
                                   const std::vector<c10::IValue>& inputs, std::vector<double>* stage_seconds,
                                   std::vector<std::vector<at::Tensor>>* stage_outputs_out) {
  std::vector<std::vector<at::Tensor>> outputs(manifest.num_stages);
  if (stage_seconds) stage_seconds->assign(manifest.num_stages, 0.0);
  for (int k = 0; k < manifest.num_stages; ++k) {
    std::vector<c10::IValue> args;
    for (const auto& src : manifest.stages[k].inputs) {
      args.push_back(src.kind == ValueSource::Kind::kInput ? inputs.at(src.index)
                                                           : c10::IValue(outputs.at(src.stage).at(src.index)));
    }
    auto start = std::chrono::steady_clock::now();
    auto result = modules[k].forward(args);
    if (stage_seconds) {
      (*stage_seconds)[k] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    for (const auto& e : result.toTupleRef().elements()) outputs[k].push_back(e.toTensor());
  }
  std::vector<at::Tensor> model_outputs;
  for (const auto& src : manifest.outputs) {
    model_outputs.push_back(src.kind == ValueSource::Kind::kInput ? inputs.at(src.index).toTensor()
                                                                  : outputs.at(src.stage).at(src.index));
  }
  if (stage_outputs_out) *stage_outputs_out = std::move(outputs);
  return model_outputs;
}

}  // namespace pipeforge::stage
