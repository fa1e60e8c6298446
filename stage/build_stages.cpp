#include "stage/build_stages.h"

#include <fmt/format.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <unordered_map>

#include "frontend/graph_reads.h"
#include "frontend/module_paths.h"

namespace pipeforge::stage {
namespace {

using torch::jit::Block;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

bool isTensor(const Value* v) { return v->type()->cast<c10::TensorType>() != nullptr; }

// A Python-identifier debug name for a stage input (TorchScript archives with
// names like `h0.1_in` fail to load).
std::string identifierFor(const std::string& raw, size_t index) {
  std::string name = "in" + std::to_string(index) + "_";
  for (char c : raw) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return name;
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

}  // namespace

BuiltStages buildStages(const frontend::OpenedModel& model, const frontend::ModelDag& dag,
                        const partitioner::Partition& partition) {
  Graph& graph = model.graph();
  const int num_stages = partition.num_stages;
  const size_t num_vertices = boost::num_vertices(dag.graph);

  std::unordered_map<const Node*, int> stage_of;
  for (size_t v = 0; v < num_vertices; ++v) {
    if (const Node* n = dag.graph[v].node) stage_of[n] = partition.stage_of_vertex[v];
  }
  std::unordered_map<const Value*, int> root_input_index;
  for (size_t i = 1; i < graph.inputs().size(); ++i) root_input_index[graph.inputs()[i]] = static_cast<int>(i - 1);

  // What each stage emits and reads.
  std::vector<std::set<const Node*>> emit(num_stages);
  std::vector<std::set<int>> needs_root_input(num_stages);
  std::vector<std::vector<const Value*>> stage_outputs(num_stages);  // in graph order, below
  std::vector<std::set<const Value*>> crossing_into(num_stages);
  std::set<const Value*> exported;

  std::function<void(Value*, int)> resolve = [&](Value* v, int k) {
    if (v == graph.inputs()[0]) return;
    auto root = root_input_index.find(v);
    if (root != root_input_index.end()) {
      needs_root_input[k].insert(root->second);
      return;
    }
    Node* producer = v->node();
    if (frontend::isFreeNode(producer)) {
      for (Value* in : producer->inputs()) resolve(in, k);
      return;
    }
    auto it = stage_of.find(producer);
    if (it == stage_of.end()) {
      throw StageBuildError("internal: value " + describeValue(v) + " has no stage");
    }
    int p = it->second;
    if (p == k || emit[k].count(producer)) return;
    if (isTensor(v)) {
      crossing_into[k].insert(v);
      exported.insert(v);
      return;
    }
    // A non-tensor (an int from x.size(1), say) is recomputed where it is
    // needed rather than sent: only tensors travel between stages.
    if (!producer->blocks().empty() || producer->hasSideEffects()) {
      throw StageBuildError(fmt::format(
          "value {} made in stage {} is used in stage {}, but only tensors can cross stages and it cannot be "
          "recomputed there; move the split point so its producer and users share a stage",
          describeValue(v), p, k));
    }
    emit[k].insert(producer);
    for (Value* in : producer->inputs()) resolve(in, k);
  };

  for (size_t v = 0; v < num_vertices; ++v) {
    const auto& d = dag.graph[v];
    if (!d.node || d.kind == frontend::DagNodeKind::kMarker) continue;
    emit[partition.stage_of_vertex[v]].insert(d.node);
  }
  for (int k = 0; k < num_stages; ++k) {
    std::vector<Node*> initial;
    for (const Node* n : emit[k]) initial.push_back(const_cast<Node*>(n));
    for (Node* n : initial) {
      for (Value* in : frontend::externalInputs(n)) resolve(in, k);
    }
  }

  // Model outputs.
  std::vector<Value*> model_outputs;
  {
    Value* out = graph.outputs()[0];
    if (dag.returns_tuple) {
      model_outputs.assign(out->node()->inputs().begin(), out->node()->inputs().end());
    } else {
      model_outputs.assign(graph.outputs().begin(), graph.outputs().end());
    }
  }
  for (size_t i = 0; i < model_outputs.size(); ++i) {
    Value* v = model_outputs[i];
    if (root_input_index.count(v)) continue;
    if (!isTensor(v)) {
      throw StageBuildError(fmt::format("model output {} is {}; pipeforge splits models whose outputs are tensors "
                                        "or a tuple of tensors",
                                        i, v->type()->repr_str()));
    }
    if (frontend::isFreeNode(v->node())) {
      throw StageBuildError(fmt::format("model output {} is a parameter or constant read; return a computed tensor", i));
    }
    exported.insert(v);
  }

  // Stage outputs in graph order.
  std::unordered_map<const Value*, std::pair<int, int>> output_slot;  // value -> (stage, index)
  for (Node* n : graph.nodes()) {
    for (Value* v : n->outputs()) {
      if (!exported.count(v)) continue;
      int p = stage_of.at(n);
      output_slot[v] = {p, static_cast<int>(stage_outputs[p].size())};
      stage_outputs[p].push_back(v);
    }
  }

  BuiltStages built;
  built.manifest.num_stages = num_stages;
  built.manifest.inputs = dag.input_names;
  for (Value* v : model_outputs) {
    ValueSource src;
    auto root = root_input_index.find(v);
    if (root != root_input_index.end()) {
      src.kind = ValueSource::Kind::kInput;
      src.index = root->second;
    } else {
      src.kind = ValueSource::Kind::kStage;
      src.stage = output_slot.at(v).first;
      src.index = output_slot.at(v).second;
    }
    built.manifest.outputs.push_back(src);
  }

  std::map<std::string, std::set<int>> holders;
  for (int k = 0; k < num_stages; ++k) {
    StageInfo info;
    info.index = k;
    info.file = fmt::format("stage_{}.pt", k);
    auto g = std::make_shared<Graph>();
    std::unordered_map<const Value*, Value*> env;
    Value* self = g->addInput("self");
    self->setType(graph.inputs()[0]->type());
    env[graph.inputs()[0]] = self;

    size_t input_counter = 0;
    for (int root : needs_root_input[k]) {
      const Value* orig = graph.inputs()[root + 1];
      Value* in = g->addInput(identifierFor(orig->debugName(), input_counter++));
      in->setType(orig->type());
      env[orig] = in;
      info.inputs.push_back({ValueSource::Kind::kInput, -1, root});
    }
    std::vector<const Value*> crossing(crossing_into[k].begin(), crossing_into[k].end());
    std::sort(crossing.begin(), crossing.end(),
              [&](const Value* a, const Value* b) { return output_slot.at(a) < output_slot.at(b); });
    for (const Value* orig : crossing) {
      Value* in = g->addInput(identifierFor(orig->debugName(), input_counter++));
      in->setType(orig->type());
      env[orig] = in;
      info.inputs.push_back({ValueSource::Kind::kStage, output_slot.at(orig).first, output_slot.at(orig).second});
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

    for (Node* n : graph.nodes()) {
      if (!emit[k].count(n)) continue;
      Node* clone = g->createClone(n, lookup);
      g->insertNode(clone);
      for (size_t i = 0; i < n->outputs().size(); ++i) env[n->outputs()[i]] = clone->outputs()[i];
    }
    std::vector<Value*> outs;
    for (const Value* v : stage_outputs[k]) outs.push_back(env.at(v));
    g->registerOutput(g->insertNode(g->createTuple(outs))->output());
    torch::jit::EliminateDeadCode(g);

    StageModuleBuilder builder(model.module(), k);
    torch::jit::Module module = builder.finish(g);
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
