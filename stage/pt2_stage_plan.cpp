#include "stage/pt2_stage_plan.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/ir.h>

#include <algorithm>
#include <set>
#include <unordered_map>

#include "common/error.h"
#include "frontend/model_dag.h"
#include "frontend/module_paths.h"
#include "frontend/pt2_archive.h"
#include "frontend/pt2_import.h"
#include "partitioner/partition.h"
#include "stage/build_stages.h"
#include "stage/value_meta.h"

// Note [PT2 stage files]
// ~~~~~~~~~~~~~~~~~~~~~~
// A `.pt2` model is split like any other: the importer rebuilds it as nested
// TorchScript (Note [PT2 as nested TorchScript]), the partitioner cuts that,
// and the stage builder checks the cut. What is written, though, is not the
// TorchScript stages but one exported program per stage, cut out of the
// ORIGINAL program:
//
//   model.pt2 nodes         partition (via tags)   stage_0.pt2            stage_1.pt2
//   embedding  (wte)        0                      in:  idx               in:  add
//   add                     0                      embedding, add         layer_norm, linear
//   layer_norm (blocks.0)   1                      out: (add,)            out: (linear,)
//   linear     (lm_head)    1
//
// Every TorchScript node the importer emits carries the position of the
// exported node it came from (Note [PT2 node tags]); a stage computes the
// exported nodes whose TorchScript nodes the partition gave it. Its nodes are
// copied verbatim (graph order, names, metadata, subgraphs); its inputs are
// the exported values it reads from earlier stages or the model's inputs,
// under their exported names, and its outputs the values later stages or the
// model read. Parameters, buffers and constants keep their placeholders and
// FQNs; a tied weight is read under the name the reading node's module holds
// it by, so GPT's stage 0 holds `wte.weight` and the last stage
// `lm_head.weight`, as the TorchScript stages do.
//
// Only tensors cross stages. A symbolic size a stage reads (gpt_dynamic's
// `sym_size_int_1`, the batch) is recomputed there by copying the nodes that
// make it, receiving the tensor they measure, as the TorchScript stage
// builder recomputes ints. Any other non-tensor value made in one stage and
// read in another is refused, naming it.
//
// Why the original program and not the TorchScript stage: a stage file must
// load with torch.export.load and run under torch's own export verifier; the
// exported nodes are already in that IR (with their metadata, dynamic shapes
// and higher-order subgraphs), while turning TorchScript back into export IR
// would be a second, lossy translator. The runtime runs a stage file through
// the same importer as a model file (frontend::loadModel), so training, the
// split checks and `pipeforge inspect` see an ordinary TorchScript module.

namespace pipeforge::stage {
namespace {

using json = nlohmann::ordered_json;

// Tags of every node under `n`: its own, its blocks', and, for a call the
// split did not open, the called method's.
void collectTags(const torch::jit::Node* n, std::set<int>& out) {
  static const c10::Symbol kTag = c10::Symbol::attr(frontend::kPt2NodeAttribute);
  if (n->hasAttribute(kTag)) out.insert(static_cast<int>(n->i(kTag)));
  for (const torch::jit::Block* b : n->blocks()) {
    for (const torch::jit::Node* inner : b->nodes()) collectTags(inner, out);
  }
  if (n->kind() == c10::prim::CallMethod) {
    auto type = n->input(0)->type()->cast<c10::ClassType>();
    if (!type) return;
    auto* fn = type->findMethod(n->s(c10::attr::name));
    if (!fn) return;
    for (const torch::jit::Node* inner : torch::jit::toGraphFunction(*fn).graph()->nodes()) collectTags(inner, out);
  }
}

bool isMarker(const std::string& target) {
  return target == "torch.ops.pippy._pipe_split.default" || target == "torch.ops.pipeforge.pipe_split.default";
}

class Planner {
 public:
  Planner(const frontend::Pt2Archive& archive, const frontend::ModelDag& dag, const partitioner::Partition& partition)
      : archive_(archive), dag_(dag), partition_(partition), nodes_(archive.graphJson().at("nodes")) {}

  Pt2SplitPlan run() {
    indexValues();
    assignStages();
    Pt2SplitPlan plan;
    plan.stages.resize(partition_.num_stages);
    for (int k = 0; k < partition_.num_stages; ++k) planStage(k, plan.stages[k]);
    connect(plan);
    return plan;
  }

 private:
  [[noreturn]] void refuse(const std::string& message) const {
    throw StageBuildError(fmt::format("'{}': cannot write .pt2 stage files: {}", archive_.path(), message));
  }

  // pipe.json's description of a parameter, in the dtype the export
  // declares, without converting a value the source holds in another.
  std::string declaredMeta(const std::string& fqn) const {
    const at::Tensor& held = archive_.stored(fqn);
    const int declared = archive_.entry(fqn).convert_to;
    const at::ScalarType type = declared >= 0 ? static_cast<at::ScalarType>(declared) : held.scalar_type();
    return formatValueMeta({canonicalDtypeName(c10::toString(type)), held.sizes().vec()});
  }

  void indexValues() {
    const auto& sig = archive_.signature();
    for (size_t i = 0; i < sig.inputs.size(); ++i) {
      const auto& in = sig.inputs[i];
      if (in.kind == frontend::Pt2InputKind::kUserInput) {
        user_input_[in.value] = static_cast<int>(user_inputs_.size());
        user_inputs_.push_back(in.value);
      } else if (!in.value.empty()) {
        lifted_[in.value] = static_cast<int>(i);
        placeholder_of_[in.target] = in.value;
      }
    }
    for (const auto& group : dag_.aliases) {
      for (const auto& fqn : group) group_of_[fqn] = group;
    }
    for (int i = 0; i < static_cast<int>(nodes_.size()); ++i) {
      for (const auto& d : frontend::pt2NodeDefs(nodes_[i])) def_[d] = i;
    }
    const json& graph = archive_.graphJson();
    for (const char* table : {"sym_int_values", "sym_bool_values", "sym_float_values"}) {
      if (!graph.contains(table)) continue;
      for (const auto& [name, value] : graph.at(table).items()) symbolic_.insert(name);
    }
  }

  // Stage of every exported node, from the tags on the partitioned vertices.
  // A node with no tagged vertex (none in practice) joins its latest input.
  void assignStages() {
    stage_.assign(nodes_.size(), -1);
    for (size_t v = 0; v < boost::num_vertices(dag_.graph); ++v) {
      const auto& d = dag_.graph[v];
      if (!d.node || d.kind == frontend::DagNodeKind::kMarker) continue;
      std::set<int> tags;
      collectTags(d.node, tags);
      for (int t : tags) {
        if (t >= 0 && t < static_cast<int>(stage_.size())) stage_[t] = std::max(stage_[t], partition_.stage_of_vertex[v]);
      }
    }
    for (int i = 0; i < static_cast<int>(nodes_.size()); ++i) {
      if (stage_[i] >= 0) continue;
      int s = 0;
      for (const auto& u : frontend::pt2NodeUses(nodes_[i])) {
        auto d = def_.find(u);
        if (d != def_.end()) s = std::max(s, stage_[d->second]);
      }
      stage_[i] = s;
    }
  }

  std::string target(int i) const { return nodes_[i].at("target").get<std::string>(); }

  // A node that makes only symbolic values (sizes and their arithmetic) can
  // be recomputed by a later stage that reads them.
  bool recomputable(int i) const {
    if (target(i).rfind("torch.ops.higher_order.", 0) == 0) return false;
    auto defs = frontend::pt2NodeDefs(nodes_[i]);
    if (defs.empty()) return false;
    return std::all_of(defs.begin(), defs.end(), [&](const std::string& d) { return symbolic_.count(d) > 0; });
  }

  // Tied weights: the name of `fqn`'s tensor that lies inside the node's module.
  std::string heldName(const std::string& fqn, const std::string& module) const {
    if (frontend::isWithin(fqn, module)) return fqn;
    auto group = group_of_.find(fqn);
    if (group == group_of_.end()) return fqn;
    for (const auto& alias : group->second) {
      if (frontend::isWithin(alias, module) && placeholder_of_.count(alias)) return alias;
    }
    return fqn;
  }

  void planStage(int k, Pt2StagePlan& out) {
    std::set<int> members;
    for (int i = 0; i < static_cast<int>(nodes_.size()); ++i) {
      if (stage_[i] == k && !isMarker(target(i))) members.insert(i);
    }
    std::set<int> lifted;
    std::set<std::string> inputs;
    std::vector<int> work(members.begin(), members.end());
    while (!work.empty()) {
      int i = work.back();
      work.pop_back();
      const auto& stack = archive_.nodes()[i].module_stack;
      const std::string module = stack.empty() ? "" : stack.back().path;
      for (const auto& u : frontend::pt2NodeUses(nodes_[i])) {
        if (auto l = lifted_.find(u); l != lifted_.end()) {
          const std::string& fqn = archive_.signature().inputs[l->second].target;
          std::string held = heldName(fqn, module);
          if (held != fqn) out.renames[i][u] = placeholder_of_.at(held);
          lifted.insert(lifted_.at(placeholder_of_.at(held)));
          continue;
        }
        if (user_input_.count(u)) {
          inputs.insert(u);
          continue;
        }
        auto d = def_.find(u);
        if (d == def_.end()) refuse(fmt::format("node '{}' reads '{}', which no node makes", nodeName(i), u));
        int p = d->second;
        if (members.count(p)) continue;
        PIPEFORGE_CHECK(stage_[p] <= k, fmt::format("stage {} reads '{}' which stage {} makes", k, u, stage_[p]));
        if (archive_.graphJson().at("tensor_values").contains(u)) {
          inputs.insert(u);
          continue;
        }
        if (!recomputable(p)) {
          refuse(fmt::format("stage {} reads '{}' (not a tensor), made by node '{}' ({}) in stage {}; only tensors "
                             "cross .pt2 stages: move the split point so that node and its users share a stage",
                             k, u, nodeName(p), target(p), stage_[p]));
        }
        members.insert(p);  // a symbolic size: recomputed here
        work.push_back(p);
      }
    }
    out.nodes.assign(members.begin(), members.end());
    out.lifted.assign(lifted.begin(), lifted.end());
    for (const auto& name : inputs) stage_inputs_[k].insert(name);
    for (const auto& spec : archive_.signature().outputs) {
      if (spec.kind != frontend::Pt2OutputKind::kBufferMutation) continue;
      auto d = def_.find(spec.value);
      if (d == def_.end() || stage_[d->second] != k) continue;
      out.mutations.emplace_back(spec.value, spec.target);
      auto p = placeholder_of_.find(spec.target);
      if (p != placeholder_of_.end()) {
        out.lifted.push_back(lifted_.at(p->second));
      }
    }
    std::sort(out.lifted.begin(), out.lifted.end());
    out.lifted.erase(std::unique(out.lifted.begin(), out.lifted.end()), out.lifted.end());
  }

  std::string nodeName(int i) const { return nodes_[i].value("name", fmt::format("#{}", i)); }

  // Sources, outputs and the manifest.
  void connect(Pt2SplitPlan& plan) {
    const int n = partition_.num_stages;
    // Values each stage sends: read by a later stage or returned by the model.
    std::vector<std::set<std::string>> sends(n);
    auto producer = [&](const std::string& value) { return stage_[def_.at(value)]; };
    for (int k = 0; k < n; ++k) {
      for (const auto& v : stage_inputs_[k]) {
        if (!user_input_.count(v)) sends[producer(v)].insert(v);
      }
    }
    std::vector<std::string> model_outputs;
    for (const auto& spec : archive_.signature().outputs) {
      if (spec.kind != frontend::Pt2OutputKind::kUserOutput) continue;
      model_outputs.push_back(spec.value);
      if (user_input_.count(spec.value)) continue;
      if (lifted_.count(spec.value)) {
        refuse(fmt::format("forward returns the parameter or buffer '{}' itself; return a computed tensor instead",
                           spec.value));
      }
      sends[producer(spec.value)].insert(spec.value);
    }
    // Outputs in graph order of their producing nodes.
    std::map<std::string, ValueSource> source_of;
    for (int k = 0; k < n; ++k) {
      std::vector<std::string> ordered(sends[k].begin(), sends[k].end());
      std::sort(ordered.begin(), ordered.end(), [&](const std::string& a, const std::string& b) {
        return std::make_pair(def_.at(a), a) < std::make_pair(def_.at(b), b);
      });
      for (size_t i = 0; i < ordered.size(); ++i) {
        source_of[ordered[i]] = ValueSource{ValueSource::Kind::kStage, k, static_cast<int>(i)};
      }
      plan.stages[k].outputs = ordered;
    }
    for (size_t i = 0; i < user_inputs_.size(); ++i) {
      source_of[user_inputs_[i]] = ValueSource{ValueSource::Kind::kInput, -1, static_cast<int>(i)};
    }

    PipeManifest& m = plan.manifest;
    m.num_stages = n;
    m.inputs = user_inputs_;
    for (const auto& v : model_outputs) m.outputs.push_back(source_of.at(v));
    std::map<std::string, std::set<int>> holders;
    for (int k = 0; k < n; ++k) {
      Pt2StagePlan& stage = plan.stages[k];
      // Manifest order: model inputs, then by (stage, index).
      std::vector<std::string> ins(stage_inputs_[k].begin(), stage_inputs_[k].end());
      std::sort(ins.begin(), ins.end(), [&](const std::string& a, const std::string& b) {
        const ValueSource& sa = source_of.at(a);
        const ValueSource& sb = source_of.at(b);
        auto key = [](const ValueSource& s) {
          return std::make_tuple(s.kind == ValueSource::Kind::kInput ? 0 : 1, s.stage, s.index);
        };
        return key(sa) < key(sb);
      });
      stage.inputs = ins;
      StageInfo info;
      info.index = k;
      info.file = fmt::format("stage_{}.pt2", k);
      for (const auto& v : ins) info.inputs.push_back(source_of.at(v));
      info.num_outputs = static_cast<int>(stage.outputs.size());
      for (int l : stage.lifted) {
        const auto& spec = archive_.signature().inputs[l];
        if (spec.kind == frontend::Pt2InputKind::kParameter) {
          info.parameters.push_back(spec.target);
          info.parameter_meta.push_back(declaredMeta(spec.target));  // metadata: no bytes read
        } else {
          info.buffers.push_back(spec.target);
        }
        holders[spec.target].insert(k);
      }
      m.stages.push_back(std::move(info));
    }
    std::set<std::vector<std::string>> tied(dag_.aliases.begin(), dag_.aliases.end());
    for (const auto& [name, stages] : holders) {
      if (stages.size() > 1 && !group_of_.count(name)) tied.insert({name});
    }
    m.tied.assign(tied.begin(), tied.end());
    for (const auto& entry : archive_.tensors()) {
      bool held = holders.count(entry.fqn) > 0;
      auto group = group_of_.find(entry.fqn);
      if (group != group_of_.end()) {
        for (const auto& alias : group->second) held = held || holders.count(alias) > 0;
      }
      if (!held) m.unused.push_back(entry.fqn);
    }
  }

  const frontend::Pt2Archive& archive_;
  const frontend::ModelDag& dag_;
  const partitioner::Partition& partition_;
  const json& nodes_;
  std::vector<int> stage_;
  std::unordered_map<std::string, int> def_;         // value -> node that makes it
  std::unordered_map<std::string, int> user_input_;  // value -> model input index
  std::vector<std::string> user_inputs_;
  std::unordered_map<std::string, int> lifted_;      // placeholder -> signature input position
  std::unordered_map<std::string, std::string> placeholder_of_;  // FQN -> placeholder
  std::unordered_map<std::string, std::vector<std::string>> group_of_;  // tied FQN -> its group
  std::set<std::string> symbolic_;
  std::map<int, std::set<std::string>> stage_inputs_;
};

}  // namespace

Pt2SplitPlan planPt2Stages(const frontend::Pt2Archive& archive, const frontend::ModelDag& dag,
                           const partitioner::Partition& partition) {
  try {
    return Planner(archive, dag, partition).run();
  } catch (const nlohmann::ordered_json::exception& e) {
    throw StageBuildError(fmt::format("'{}': unexpected exported graph structure while planning .pt2 stages ({})",
                                      archive.path(), e.what()));
  }
}

}  // namespace pipeforge::stage
