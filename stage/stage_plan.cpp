#include "stage/stage_plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/script.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <utility>

#include "frontend/model_dag.h"
#include "frontend/module_paths.h"

namespace pipeforge::stage {
namespace {

using torch::jit::Block;
using torch::jit::Node;
using torch::jit::Value;

// A Python-identifier debug name for a stage input (TorchScript archives with
// names like `h0.1_in` fail to load).
std::string identifierFor(const std::string& raw, size_t index) {
  std::string name = "in" + std::to_string(index) + "_";
  for (char c : raw) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return name;
}

// The text of a dict key constant, or "key" when it is none.
std::string keyText(const Value* key) {
  auto value = torch::jit::toIValue(key);
  if (!value) return "key";
  return value->isString() ? value->toStringRef() : std::to_string(value->toInt());
}

// The raw name of a stage input, made an identifier by identifierFor.
std::string inputName(const Sent& what) {
  switch (what.kind) {
    case Sent::Kind::kValue:
      return what.value->debugName();
    case Sent::Kind::kListElement:
      return fmt::format("{}_{}", what.value->debugName(), what.index);
    case Sent::Kind::kDictValue:
      return fmt::format("{}_{}", what.value->debugName(), keyText(what.key));
    case Sent::Kind::kAttribute:
      return what.fqn;
  }
  return "value";
}

std::string describeSource(const ValueSource& source) {
  switch (source.kind) {
    case ValueSource::Kind::kInput:
      return fmt::format("model input {}", source.index);
    case ValueSource::Kind::kStage:
      return fmt::format("stage {} output {}", source.stage, source.index);
  }
  return "?";
}

// "%h.1", "%hs.1[0]", "%d.1["h"]", "attribute counter.count".
std::string describeSent(const Sent& what) {
  switch (what.kind) {
    case Sent::Kind::kValue:
      return "%" + what.value->debugName();
    case Sent::Kind::kListElement:
      return fmt::format("%{}[{}]", what.value->debugName(), what.index);
    case Sent::Kind::kDictValue: {
      auto key = torch::jit::toIValue(what.key);
      bool quote = key && key->isString();
      return fmt::format("%{}[{}{}{}]", what.value->debugName(), quote ? "\"" : "", keyText(what.key),
                         quote ? "\"" : "");
    }
    case Sent::Kind::kAttribute:
      return "attribute " + what.fqn;
  }
  return "?";
}

// "call layers.0" (or "call counter (bump)" for a method other than forward), else the op.
std::string describeEmitted(const Node* n) {
  if (n->kind() == c10::prim::CallMethod) {
    std::string callee = frontend::attributePath(n->input(0)).value_or("?");
    const std::string& method = n->s(c10::attr::name);
    return method == "forward" ? "call " + callee : fmt::format("call {} ({})", callee, method);
  }
  return n->kind().toQualString();
}

void collectGetAttrs(const Block* block, std::vector<const Node*>& out) {
  for (const Node* n : block->nodes()) {
    if (n->kind() == c10::prim::GetAttr) out.push_back(n);
    for (const Block* b : n->blocks()) collectGetAttrs(b, out);
  }
}

// The containers a stage's tree has so far and the names each holds, as the
// builder will register them.
class TreeLayout {
 public:
  TreeLayout() { names_[""]; }

  bool has(const std::string& container, const std::string& name) const {
    return names_.at(container).count(name) != 0;
  }

  // Opens the container at `path`, and its parents first, when not yet open.
  void open(const std::string& path) {
    if (names_.count(path)) return;
    open(frontend::splitPath(path).first);
    add(StageModuleEntry::Kind::kOpened, path);
    names_[path];
  }

  void add(StageModuleEntry::Kind kind, const std::string& fqn) {
    auto [parent, name] = frontend::splitPath(fqn);
    names_.at(parent).insert(name);
    modules_.entries.push_back({kind, fqn});
  }

  StageModules take() { return std::move(modules_); }

 private:
  std::map<std::string, std::set<std::string>> names_;  // open container -> names registered on it
  StageModules modules_;
};

}  // namespace

SplitPlan planStages(const frontend::OpenedModel& model, const frontend::ModelDag& dag,
                     const partitioner::Partition& partition) {
  // What each stage computes, receives and sends (Note [Mutable state across stages]).
  DataflowPlan dataflow = planDataflow(model, dag, partition);
  SplitPlan plan;
  plan.model_inputs = dag.input_names;
  plan.model_outputs = std::move(dataflow.model_outputs);
  for (StageDataflow& flow : dataflow.stages) {
    StagePlan stage;
    for (size_t i = 0; i < flow.inputs.size(); ++i) {
      stage.input_names.push_back(identifierFor(inputName(flow.inputs[i].what), i));
    }
    stage.flow = std::move(flow);
    plan.stages.push_back(std::move(stage));
  }
  return plan;
}

std::string toString(const SplitPlan& plan) {
  std::string out = fmt::format("model inputs: {}\n", fmt::join(plan.model_inputs, ", "));
  for (size_t k = 0; k < plan.stages.size(); ++k) {
    const StageDataflow& flow = plan.stages[k].flow;
    std::vector<std::string> emitted;
    for (const Node* n : flow.emit) emitted.push_back(describeEmitted(n));
    out += fmt::format("stage {}\n  emits: {}\n", k, fmt::join(emitted, ", "));
    for (size_t i = 0; i < flow.inputs.size(); ++i) {
      out += fmt::format("  input {}: {}, {}, named {}\n", i, describeSource(flow.inputs[i].source),
                         describeSent(flow.inputs[i].what), plan.stages[k].input_names[i]);
    }
    for (const RebuiltContainer& c : flow.containers) {
      std::vector<std::string> names;
      for (const Value* v : c.names) names.push_back("%" + v->debugName());
      out += fmt::format("  rebuilds {} {} from inputs {}\n", c.is_dict ? "dict" : "list", fmt::join(names, " = "),
                         fmt::join(c.elements, ", "));
    }
    for (size_t i = 0; i < flow.outputs.size(); ++i) {
      out += fmt::format("  output {}: {}\n", i, describeSent(flow.outputs[i]));
    }
  }
  std::vector<std::string> outputs;
  for (const ValueSource& source : plan.model_outputs) outputs.push_back(describeSource(source));
  out += fmt::format("model outputs: {}\n", fmt::join(outputs, ", "));
  return out;
}

// Note [Stage module trees]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A stage holds the modules, tensors and attributes its graph reads, under
// their original names. A module the graph uses as a whole (calls it, or
// passes it on) is the model's own object, and nothing inside it is added
// again. A module the graph only reaches into (`layers` for
// `self.layers.0`, or `block` for `self.block.scale` where the split opened
// `block`) becomes a new, empty container holding just what is read: for
// stage 0 of the seed example, `layers` holds only `0`. Wholes are
// registered first, in name order, then the tensors and attributes read, in
// name order; containers are opened as the first entry under them needs
// them. That order is the order of the stage's parameters in pipe.json.
//
// The tree is read off the graph built for the stage, after dead code is
// gone, not off the nodes the stage computes: a stage computes its own nodes
// even when only a later stage needs their value (a size that stage computes
// again, Note [Mutable state across stages]); elimination drops them and
// their reads, and the stage holds no copy of what only they read.
StageModules planStageModules(const torch::jit::Module& model, const torch::jit::Graph& stage_graph) {
  std::vector<const Node*> getattrs;
  collectGetAttrs(stage_graph.block(), getattrs);
  std::set<std::string> used_whole;
  std::set<std::string> attributes;
  for (const Node* n : getattrs) {
    auto path = frontend::attributePath(n->output());
    if (!path) continue;
    if (n->output()->type()->cast<c10::ClassType>()) {
      for (const auto& use : n->output()->uses()) {
        if (use.user->kind() != c10::prim::GetAttr) used_whole.insert(*path);
      }
    } else {
      attributes.insert(*path);
    }
  }

  TreeLayout tree;
  std::vector<std::string> whole;
  auto within_whole = [&](const std::string& path, bool strictly) {
    return std::any_of(whole.begin(), whole.end(), [&](const std::string& w) {
      return frontend::isWithin(path, w) && (!strictly || path != w);
    });
  };
  for (const auto& path : used_whole) {
    bool covered = std::any_of(used_whole.begin(), used_whole.end(), [&](const std::string& other) {
      return other != path && frontend::isWithin(path, other);
    });
    if (covered) continue;
    tree.open(frontend::splitPath(path).first);
    tree.add(StageModuleEntry::Kind::kWhole, path);
    whole.push_back(path);
  }
  for (const auto& path : attributes) {
    if (within_whole(path, /*strictly=*/true)) continue;
    auto [parent, name] = frontend::splitPath(path);
    auto type = frontend::submoduleAt(model, parent).type();
    tree.open(parent);
    if (tree.has(parent, name)) continue;
    auto slot = type->getAttributeSlot(name);
    tree.add(type->is_parameter(slot) ? StageModuleEntry::Kind::kParameter
             : type->is_buffer(slot)  ? StageModuleEntry::Kind::kBuffer
                                      : StageModuleEntry::Kind::kAttribute,
             path);
  }
  // Every module-valued read becomes the whole module or a container (the
  // builder retypes the read to it), so a read nothing above opened opens one.
  for (const Node* n : getattrs) {
    if (!n->output()->type()->cast<c10::ClassType>()) continue;
    auto path = frontend::attributePath(n->output());
    if (!path || within_whole(*path, /*strictly=*/false)) continue;
    tree.open(*path);
  }
  return tree.take();
}

std::string toString(const StageModules& modules) {
  std::string out;
  for (const StageModuleEntry& e : modules.entries) {
    const char* kind = "";
    switch (e.kind) {
      case StageModuleEntry::Kind::kOpened:
        kind = "opened";
        break;
      case StageModuleEntry::Kind::kWhole:
        kind = "whole";
        break;
      case StageModuleEntry::Kind::kParameter:
        kind = "parameter";
        break;
      case StageModuleEntry::Kind::kBuffer:
        kind = "buffer";
        break;
      case StageModuleEntry::Kind::kAttribute:
        kind = "attribute";
        break;
    }
    out += fmt::format("{} {}\n", kind, e.fqn);
  }
  return out;
}

}  // namespace pipeforge::stage
