#include "stage/stage_dataflow.h"

#include <fmt/format.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/script.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "common/error.h"
#include "frontend/graph_reads.h"
#include "frontend/model_dag.h"
#include "frontend/module_paths.h"
#include "frontend/opened_model.h"
#include "partitioner/partition.h"
#include "stage/container_replay.h"
#include "stage/errors.h"
#include "stage/points_to.h"
#include "stage/write_timeline.h"

// Note [Mutable state across stages]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A stage sees only what it computes and what it receives, so every change a
// model makes in place must reach the stages that read the changed memory
// later, or the split is wrong with no error at all. Stages are contiguous in
// graph order, so the state stage k must start from is the state after every
// node of stages 0..k-1. PointsTo says which memory each value may be and
// which top-level node writes it; for every value stage k reads but does not
// compute:
//
//  * A tensor comes from the last stage before k that wrote its memory, or
//    from the stage that made it when no later one did. A stage that changes a
//    tensor it received sends it on. If that stage does not hold the value
//    (it wrote through another value sharing the memory), the split is refused.
//  * A list or dict that a stage before k changed (append, insert, pop,
//    _set_item, ...) comes from the last such stage as its tensors and is
//    rebuilt at the start of k. FPN code
//        feats = []; feats.append(c2(x)); feats.append(c3(...))   # stage 0
//        feats.append(c4(...)); return torch.stack(feats)         # stage 1
//    sends feats[0] and feats[1] from stage 0 as two tensors, and stage 1
//    starts with `feats = [in0, in1]`. Its length (or keys) must be known when
//    splitting: made by a literal, changed only by top-level ops with constant
//    indices and keys. Anything else (a change inside a loop, an if or a call,
//    a list of ints, a list made by a call) is refused, naming the op, the
//    value, the modules and the fix.
//  * Any other non-tensor value (an int, a list of sizes) is recomputed in k,
//    as before, unless its producer writes memory, or memory it reads is
//    written between the producer and stage k: then the split is refused.
//  * A module attribute (a buffer) written in place in stage j goes, as a
//    copy made at the end of j, to each later stage that reads it through a
//    top-level prim::GetAttr; that stage then holds no copy of its own. A
//    stage before j that reads it, a second stage writing it, a read inside a
//    call, an if or a loop, a parameter, a non-tensor attribute: refused, since
//    a copy held by another stage drifts from the writer's copy.
//  * A stage that writes memory reaching it twice (a tensor, and the same
//    tensor inside a received list) is refused: after the split those are two
//    copies, and the write would reach only one.
// checkChangedStateHeldOnce repeats the attribute rule on the built stage
// modules, so no stage keeps a copy of state another stage changes even where
// this planner missed a path.

namespace pipeforge::stage {
namespace {

using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

bool isTensor(const Value* v) { return v->type()->cast<c10::TensorType>() != nullptr; }

std::string describeValue(const Value* v) { return fmt::format("%{} ({})", v->debugName(), v->type()->repr_str()); }

std::string quoted(const std::string& fqn) { return fqn.empty() ? "the root module" : "`" + fqn + "`"; }

// List[Tensor] or Dict[str|int, Tensor]: the containers that can travel as their tensors.
bool isTensorList(const c10::TypePtr& type) {
  auto list = type->cast<c10::ListType>();
  return list && list->getElementType()->kind() == c10::TypeKind::TensorType;
}

bool isTensorDict(const c10::TypePtr& type) {
  auto dict = type->cast<c10::DictType>();
  if (!dict || dict->getValueType()->kind() != c10::TypeKind::TensorType) return false;
  auto key = dict->getKeyType()->kind();
  return key == c10::TypeKind::StringType || key == c10::TypeKind::IntType;
}

[[noreturn]] void refuse(const std::string& message) { throw StageBuildError(message); }

// What planning reads and never changes: the graph and its memory, the stage
// and graph position of each top-level node, who writes what, and how each of
// these is named in a refusal.
struct SplitFacts {
  SplitFacts(const frontend::OpenedModel& opened, const frontend::ModelDag& dag,
             const partitioner::Partition& partition)
      : model(opened),
        graph(opened.graph()),
        pt(opened.module(), opened.graph()),
        num_stages(partition.num_stages),
        returns_tuple(dag.returns_tuple) {
    const size_t num_vertices = boost::num_vertices(dag.graph);
    for (size_t v = 0; v < num_vertices; ++v) {
      if (const Node* n = dag.graph[v].node) stage_of[n] = partition.stage_of_vertex[v];
    }
    int next = 0;
    for (const Node* n : graph.nodes()) position[n] = next++;
    for (size_t i = 1; i < graph.inputs().size(); ++i) root_index[graph.inputs()[i]] = static_cast<int>(i - 1);
    for (const Node* n : graph.nodes()) {
      auto home = stage_of.find(n);
      if (home == stage_of.end()) continue;
      for (const MemoryWrite& w : pt.writes(n)) writes.add(w.object, {position.at(n), home->second, n, w.op});
    }
  }

  int positionOf(const Value* v) const {
    if (root_index.count(v)) return -1;
    return position.at(v->node());
  }

  // `nodes` in graph order.
  std::vector<const Node*> inGraphOrder(const std::set<const Node*>& nodes) const {
    std::vector<const Node*> ordered(nodes.begin(), nodes.end());
    std::sort(ordered.begin(), ordered.end(),
              [&](const Node* a, const Node* b) { return position.at(a) < position.at(b); });
    return ordered;
  }

  // "aten::stack at code/__torch__.py:25 in the code of the root module",
  // "the call to `counter` at code/__torch__.py:12 in the code of the root module".
  std::string describeNode(const Node* n) const {
    std::string what = n->kind() == c10::prim::CallMethod
                           ? fmt::format("the call to {}", quoted(frontend::attributePath(n->input(0)).value_or("?")))
                           : std::string(n->kind().toQualString());
    std::string op = describeOp(n);
    auto at = op.find(" at ");
    if (at != std::string::npos) what += op.substr(at);
    return fmt::format("{} in the code of {}", what, quoted(model.ownerOf(n)));
  }

  // A write as a user finds it in the code: the op, and the call, if or loop holding it.
  std::string describeWrite(const Node* top, const std::string& op) const {
    if (top->kind() == c10::prim::CallMethod || top->kind() == c10::prim::CallFunction) {
      return fmt::format("{}, reached by {}", op, describeNode(top));  // op: "aten::add_ at ... inside `counter`"
    }
    if (!top->blocks().empty()) return fmt::format("{}, inside {}", op, describeNode(top));
    return describeNode(top);
  }
  std::string describeWrite(const Writer& w) const { return describeWrite(w.node, w.op); }

  std::string describeObject(ObjectId o) const {
    const MemoryObject& obj = pt.object(o);
    switch (obj.kind) {
      case MemoryObject::Kind::kAttribute:
        return fmt::format("{} `{}`", obj.is_parameter ? "parameter" : obj.is_tensor ? "buffer" : "attribute",
                           obj.name);
      case MemoryObject::Kind::kMade:
        if (obj.value) return fmt::format("{} made by {}", describeValue(obj.value), describeNode(obj.value->node()));
        return obj.name;
      case MemoryObject::Kind::kModelInput:
      case MemoryObject::Kind::kConstant:
      case MemoryObject::Kind::kOpaque:
        return obj.name;
    }
    return obj.name;
  }

  const frontend::OpenedModel& model;
  torch::jit::Graph& graph;
  const PointsTo pt;
  const int num_stages;
  const bool returns_tuple;
  std::unordered_map<const Node*, int> stage_of;  // home stage of every node that does work
  std::unordered_map<const Node*, int> position;  // top-level nodes, graph order
  std::unordered_map<const Value*, int> root_index;
  WriteTimeline writes;
};

// A received thing: what it is, who sends it, and the memory it may be.
struct Receipt {
  int sender = 0;
  Sent what;
  std::vector<const Value*> binds;
  std::vector<ObjectId> objects;
  std::string description;
};

struct StageState {
  std::set<const Node*> emit;
  std::set<int> root_inputs;
  std::vector<Receipt> receipts;
  std::map<const Value*, int> received_value;      // tensor -> receipt
  std::map<ObjectId, int> received_attribute;      // attribute object -> receipt
  std::map<ObjectId, int> rebuilt;                 // container object -> index in `containers`
  std::vector<RebuiltContainer> containers;        // elements index `receipts` until finished
  // attribute object -> a prim::GetAttr cloned here, and a node reading it
  std::map<ObjectId, std::pair<const Value*, const Node*>> held_attribute;
};

// ---- checks on what the stages hold (Note [Mutable state across stages]) ----

using AttributeWriters = std::map<ObjectId, const Writer*>;  // attribute object -> its one writing stage's write

// The write of each persistent object changed in place; refuses one that two
// stages change.
AttributeWriters planAttributeWriters(const SplitFacts& facts) {
  AttributeWriters attribute_writers;
  for (const auto& [object, writers] : facts.writes.byObject()) {
    if (!facts.pt.object(object).persistent()) continue;
    std::map<int, const Writer*> by_stage;
    for (const Writer& w : writers) by_stage.emplace(w.stage, &w);
    if (by_stage.size() > 1) {
      auto first = by_stage.begin();
      auto second = std::next(first);
      refuse(fmt::format("{} is changed in place in stage {} ({}) and in stage {} ({}); each stage would keep its "
                         "own copy and the copies would drift apart; move the split so that every writer of `{}` "
                         "is in one stage",
                         facts.describeObject(object), first->first, facts.describeWrite(*first->second),
                         second->first, facts.describeWrite(*second->second), facts.pt.object(object).name));
    }
    attribute_writers[object] = by_stage.begin()->second;
  }
  return attribute_writers;
}

// How stage `l` reads `object` other than as a received copy ("by <node>",
// "as `fqn` by <node>"), or "" when it does not.
std::string readerOf(const SplitFacts& facts, const StageState& state, ObjectId object) {
  for (const Node* n : facts.inGraphOrder(state.emit)) {
    auto touched = facts.pt.attributesTouched(n);
    if (std::find(touched.begin(), touched.end(), object) != touched.end()) return "by " + facts.describeNode(n);
  }
  auto held = state.held_attribute.find(object);
  if (held == state.held_attribute.end()) return "";
  return fmt::format("as `{}` by {}",
                     frontend::attributePath(held->second.first).value_or(facts.pt.object(object).name),
                     facts.describeNode(held->second.second));
}

// A stage other than the writer may read an attribute only as a received
// copy (Note [Mutable state across stages]).
void checkAttributeHolders(const SplitFacts& facts, const AttributeWriters& attribute_writers,
                           const std::vector<StageState>& stages) {
  for (const auto& [object, writer] : attribute_writers) {
    const MemoryObject& obj = facts.pt.object(object);
    for (int l = 0; l < facts.num_stages; ++l) {
      if (l == writer->stage) continue;
      std::string reader = readerOf(facts, stages[l], object);
      if (reader.empty()) continue;
      std::string why;
      if (l < writer->stage) {
        why = fmt::format("stage {} runs before stage {} and cannot receive the changed value", l, writer->stage);
      } else if (!obj.is_tensor) {
        why = "only tensors travel between stages";
      } else if (obj.is_parameter) {
        why = "a parameter changed by forward cannot be sent to another stage";
      } else {
        why = "the read is inside a submodule call, an if or a loop, where a stage input cannot replace it";
      }
      refuse(fmt::format("{} is changed in place in stage {} ({}) and read in stage {} ({}); {}, so stage {}'s "
                         "copy would go stale; move the split so that `{}`'s writer and readers are in one stage",
                         facts.describeObject(object), writer->stage, facts.describeWrite(*writer), l, reader, why, l,
                         obj.name));
    }
  }
}

// Each way memory reaches a stage, described, with the memory it may be.
std::vector<std::pair<std::string, std::vector<ObjectId>>> waysIn(const SplitFacts& facts, const StageState& state) {
  std::vector<std::pair<std::string, std::vector<ObjectId>>> ways;
  for (int index : state.root_inputs) {
    const Value* in = facts.graph.inputs()[index + 1];
    ways.emplace_back("model input " + describeValue(in), facts.pt.pointsTo(in));
  }
  for (const Receipt& r : state.receipts) ways.emplace_back(r.description, r.objects);
  for (const auto& [object, index] : state.rebuilt) {
    ways.emplace_back(describeValue(state.containers[index].names.back()), std::vector<ObjectId>{object});
  }
  std::set<ObjectId> held;
  for (const Node* n : state.emit) {
    for (ObjectId o : facts.pt.attributesTouched(n)) held.insert(o);
  }
  for (const auto& [object, getattr] : state.held_attribute) held.insert(object);
  for (ObjectId o : held) ways.emplace_back(facts.describeObject(o), std::vector<ObjectId>{o});
  return ways;
}

// Stage `s` must not write memory that reaches it by two ways (see the Note).
void checkSingleCopy(const SplitFacts& facts, const StageState& state, int s) {
  const auto ways = waysIn(facts, state);
  for (const Node* n : facts.inGraphOrder(state.emit)) {
    if (facts.stage_of.at(n) != s) continue;
    for (const MemoryWrite& w : facts.pt.writes(n)) {
      std::vector<std::string> reaching;
      for (const auto& [description, objects] : ways) {
        if (std::find(objects.begin(), objects.end(), w.object) != objects.end()) reaching.push_back(description);
      }
      if (reaching.size() < 2) continue;
      refuse(fmt::format("stage {} changes {} in place ({}), but that memory reaches stage {} twice, as {} and as {}; "
                         "after the split these are two copies and the change would reach only one; move the split "
                         "so that they are made and changed in one stage",
                         s, facts.describeObject(w.object), facts.describeWrite(n, w.op), s, reaching[0],
                         reaching[1]));
    }
  }
}

// ---- the plan ----------------------------------------------------------------

// Sort key of what stage `s` sends: values it makes (graph order, as always),
// then values it passes on, container elements, attributes.
std::tuple<int, int, int64_t, std::string> exportKey(const SplitFacts& facts, int s, const Sent& what) {
  switch (what.kind) {
    case Sent::Kind::kValue: {
      auto home = facts.stage_of.find(what.value->node());
      bool own = home != facts.stage_of.end() && home->second == s && !facts.root_index.count(what.value);
      return {own ? 0 : 1, facts.positionOf(what.value), static_cast<int64_t>(what.value->offset()), ""};
    }
    case Sent::Kind::kListElement:
    case Sent::Kind::kDictValue:
      return {2, facts.positionOf(what.value), what.index, ""};
    case Sent::Kind::kAttribute:
      return {3, 0, 0, what.fqn};
  }
  return {4, 0, 0, ""};
}

int exportIndex(const std::vector<Sent>& sent, const Sent& what) {
  return static_cast<int>(std::find(sent.begin(), sent.end(), what) - sent.begin());
}

// A stage's dataflow in manifest order: model inputs, then what it receives
// by (sender, index in what the sender sends); rebuilt containers then name
// their elements by input index. `exports` is every stage's sorted outputs.
StageDataflow stageDataflow(const SplitFacts& facts, const StageState& state, int k,
                            const std::vector<std::vector<Sent>>& exports) {
  StageDataflow out;
  out.emit = facts.inGraphOrder(state.emit);
  out.outputs = exports[k];
  for (int index : state.root_inputs) {
    StageInputPlan in;
    in.source = {ValueSource::Kind::kInput, -1, index};
    in.what.value = facts.graph.inputs()[index + 1];
    in.binds = {in.what.value};
    out.inputs.push_back(std::move(in));
  }
  std::vector<int> order(state.receipts.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  auto sourceOf = [&](int i) {
    const Receipt& r = state.receipts[i];
    return std::make_pair(r.sender, exportIndex(exports[r.sender], r.what));
  };
  std::sort(order.begin(), order.end(), [&](int a, int b) { return sourceOf(a) < sourceOf(b); });
  std::vector<int> input_of_receipt(state.receipts.size());
  for (int i : order) {
    const Receipt& r = state.receipts[i];
    input_of_receipt[i] = static_cast<int>(out.inputs.size());
    StageInputPlan in;
    auto [sender, index] = sourceOf(i);
    in.source = {ValueSource::Kind::kStage, sender, index};
    in.what = r.what;
    in.binds = r.binds;
    out.inputs.push_back(std::move(in));
  }
  out.containers = state.containers;
  for (auto& c : out.containers) {
    for (int& e : c.elements) e = input_of_receipt[e];
  }
  return out;
}

// The plan from what planning found. `model_outputs` of a stage get their
// index among what it sends from `output_sent`, one per such output, in order.
DataflowPlan assemblePlan(const SplitFacts& facts, const std::vector<StageState>& stages,
                          std::vector<std::vector<Sent>> exports, std::vector<ValueSource> model_outputs,
                          const std::vector<Sent>& output_sent) {
  for (int s = 0; s < facts.num_stages; ++s) {
    std::sort(exports[s].begin(), exports[s].end(),
              [&](const Sent& a, const Sent& b) { return exportKey(facts, s, a) < exportKey(facts, s, b); });
  }
  DataflowPlan plan;
  for (int k = 0; k < facts.num_stages; ++k) plan.stages.push_back(stageDataflow(facts, stages[k], k, exports));
  plan.model_outputs = std::move(model_outputs);
  for (size_t i = 0, next = 0; i < plan.model_outputs.size(); ++i) {
    ValueSource& src = plan.model_outputs[i];
    if (src.kind != ValueSource::Kind::kStage) continue;
    src.index = exportIndex(exports[src.stage], output_sent[next++]);
  }
  return plan;
}

// ---- a carried container's elements ------------------------------------------

// Refuses carrying `v`, read in stage `k` by `user`, as its tensors.
[[noreturn]] void refuseContainer(const SplitFacts& facts, const Value* v, int k, const Node* user,
                                  const std::string& why) {
  const char* what = v->type()->cast<c10::DictType>() ? "dict" : v->type()->cast<c10::ListType>() ? "list" : "value";
  refuse(fmt::format("{} is read in stage {} by {} after an earlier stage changed it in place; {}; move the split so "
                     "that the {}'s writers and readers share a stage",
                     describeValue(v), k, facts.describeNode(user), why, what));
}

// Applies change `n` to `c`, the contents of `object`; refuses what cannot be replayed.
void replayChange(const SplitFacts& facts, const Node* n, ObjectId object, bool is_dict, ContainerContents& c,
                  const Value* v, int k, const Node* user) {
  auto cannot = [&](const std::string& why) {
    std::string op = describeOp(n);
    for (const MemoryWrite& w : facts.pt.writes(n)) {
      if (w.object == object) op = w.op;
    }
    refuseContainer(facts, v, k, user,
                    fmt::format("stage {} changes it ({}) {}, and only a {} whose {} known when splitting can be "
                                "sent between stages as its tensors",
                                facts.stage_of.at(n), facts.describeWrite(n, op), why, is_dict ? "dict" : "list",
                                is_dict ? "keys are" : "length is"));
  };
  if (!n->blocks().empty() || n->kind() == c10::prim::CallMethod || n->kind() == c10::prim::CallFunction) {
    cannot("where it may change any number of times");
  }
  if (n->inputs().empty() || facts.pt.pointsTo(n->input(0)) != std::vector<ObjectId>{object}) {
    cannot("through a value that may also be another container");
  }
  auto is_changed_in_place = [&](const Value* other) {
    auto objects = facts.pt.reachable(other);
    return std::any_of(objects.begin(), objects.end(), [&](ObjectId o) { return facts.writes.isWritten(o); });
  };
  if (auto why = replayContainerChange(*n, is_dict, c, is_changed_in_place)) cannot(*why);
}

// The elements of a list or dict literal at the end of stage `last_stage`
// (Note [Replaying a container's changes]). Refuses what it cannot replay.
ContainerContents contentsAtEndOf(const SplitFacts& facts, int last_stage, ObjectId object, const Node* creator,
                                  const Value* v, int k, const Node* user) {
  ContainerContents c;
  if (auto why = readContainerLiteral(*creator, c)) refuseContainer(facts, v, k, user, *why);
  const int start = facts.position.at(creator);
  for (const Node* n : facts.graph.nodes()) {
    if (facts.position.at(n) <= start) continue;
    auto home = facts.stage_of.find(n);
    if (home == facts.stage_of.end() || home->second > last_stage) continue;
    const auto& writes = facts.pt.writes(n);
    auto writes_object = [&](const MemoryWrite& w) { return w.object == object; };
    if (std::any_of(writes.begin(), writes.end(), writes_object)) {
      replayChange(facts, n, object, creator->kind() == c10::prim::DictConstruct, c, v, k, user);
    }
  }
  return c;
}

// Resolves every value each stage reads but does not compute: received,
// recomputed, or carried as a container's tensors (Note [Mutable state across
// stages]); then checks what the stages hold and assembles the plan.
class DataflowPlanner {
 public:
  DataflowPlanner(const frontend::OpenedModel& model, const frontend::ModelDag& dag,
                  const partitioner::Partition& partition)
      : facts_(model, dag, partition), stages_(facts_.num_stages), exports_(facts_.num_stages) {
    const size_t num_vertices = boost::num_vertices(dag.graph);
    for (size_t v = 0; v < num_vertices; ++v) {
      const auto& d = dag.graph[v];
      if (!d.node || d.kind == frontend::DagNodeKind::kMarker) continue;
      stages_[partition.stage_of_vertex[v]].emit.insert(d.node);
    }
  }

  DataflowPlan run() {
    attribute_writers_ = planAttributeWriters(facts_);
    for (int k = 0; k < facts_.num_stages; ++k) {
      for (const Node* n : facts_.inGraphOrder(stages_[k].emit)) {
        for (Value* in : frontend::externalInputs(const_cast<Node*>(n))) resolve(in, k, n);
      }
    }
    std::vector<ValueSource> model_outputs = planModelOutputs();
    checkAttributeHolders(facts_, attribute_writers_, stages_);
    for (int s = 0; s < facts_.num_stages; ++s) checkSingleCopy(facts_, stages_[s], s);
    return assemblePlan(facts_, stages_, exports_, std::move(model_outputs), output_sent_);
  }

 private:
  bool holdsTensor(int s, const Value* v) const {
    auto root = facts_.root_index.find(v);
    if (root != facts_.root_index.end()) return stages_[s].root_inputs.count(root->second) != 0;
    auto home = facts_.stage_of.find(v->node());
    if (home != facts_.stage_of.end() && home->second == s) return true;
    return stages_[s].received_value.count(v) != 0;
  }

  bool sendsAttribute(ObjectId object, int k) const {
    auto it = attribute_writers_.find(object);
    if (it == attribute_writers_.end() || it->second->stage >= k) return false;
    const MemoryObject& obj = facts_.pt.object(object);
    return obj.kind == MemoryObject::Kind::kAttribute && obj.is_tensor && !obj.is_parameter;
  }

  // ---- receiving -----------------------------------------------------------

  int addReceipt(int k, Receipt r) {
    addExport(r.sender, r.what);
    stages_[k].receipts.push_back(std::move(r));
    return static_cast<int>(stages_[k].receipts.size()) - 1;
  }

  void addExport(int s, const Sent& what) {
    auto& list = exports_[s];
    if (std::find(list.begin(), list.end(), what) == list.end()) list.push_back(what);
  }

  void receiveTensor(int k, const Value* v, int sender) {
    if (stages_[k].received_value.count(v)) return;
    Receipt r;
    r.sender = sender;
    r.what.kind = Sent::Kind::kValue;
    r.what.value = v;
    r.binds = {v};
    r.objects = facts_.pt.pointsTo(v);
    r.description = describeValue(v);
    stages_[k].received_value[v] = addReceipt(k, std::move(r));
  }

  void receiveAttribute(int k, ObjectId object, const Value* getattr) {
    auto& state = stages_[k];
    auto it = state.received_attribute.find(object);
    if (it != state.received_attribute.end()) {
      state.receipts[it->second].binds.push_back(getattr);
      return;
    }
    Receipt r;
    r.sender = attribute_writers_.at(object)->stage;
    r.what.kind = Sent::Kind::kAttribute;
    r.what.fqn = frontend::attributePath(getattr).value_or(facts_.pt.object(object).name);
    r.binds = {getattr};
    r.objects = {object};
    r.description = "`" + r.what.fqn + "`";
    state.received_attribute[object] = addReceipt(k, std::move(r));
  }

  void resolve(Value* v, int k, const Node* user) {
    if (v == facts_.graph.inputs()[0]) return;
    auto root = facts_.root_index.find(v);
    if (root != facts_.root_index.end()) return resolveRootInput(v, root->second, k, user);
    Node* producer = v->node();
    if (frontend::isFreeNode(producer)) {
      if (producer->kind() == c10::prim::GetAttr && producer->owningBlock() == facts_.graph.block()) {
        ObjectId attribute = facts_.pt.attributeOf(v);
        if (attribute >= 0 && sendsAttribute(attribute, k)) return receiveAttribute(k, attribute, v);
        if (attribute >= 0) stages_[k].held_attribute.emplace(attribute, std::make_pair(v, user));
      }
      for (Value* in : producer->inputs()) resolve(in, k, user);
      return;
    }
    auto home = facts_.stage_of.find(producer);
    PIPEFORGE_CHECK(home != facts_.stage_of.end(), "value " + describeValue(v) + " has no stage");
    const int p = home->second;
    if (p == k || stages_[k].emit.count(producer)) return;
    if (isTensor(v)) {
      auto [writer_stages, last] = facts_.writes.between(facts_.pt.reachable(v), facts_.position.at(producer), k);
      int sender = writer_stages.empty() ? p : std::max(p, *writer_stages.rbegin());
      if (sender != p && !holdsTensor(sender, v)) refuseWriteThroughOtherValue(v, p, k, sender, last);
      return receiveTensor(k, v, sender);
    }
    auto points_to = facts_.pt.pointsTo(v);
    // Every value naming one container (`feats`, and `feats += [h]`'s result)
    // is judged from where the container was made, so they all agree.
    int since = facts_.position.at(producer);
    if (points_to.size() == 1) {
      auto rebuilt = stages_[k].rebuilt.find(points_to.front());
      if (rebuilt != stages_[k].rebuilt.end()) {
        auto& names = stages_[k].containers[rebuilt->second].names;
        if (std::find(names.begin(), names.end(), v) == names.end()) names.push_back(v);
        return;
      }
      const MemoryObject& obj = facts_.pt.object(points_to.front());
      if (obj.kind == MemoryObject::Kind::kMade && obj.value && facts_.position.count(obj.value->node())) {
        since = std::min(since, facts_.position.at(obj.value->node()));
      }
    }
    auto [writer_stages, last] = facts_.writes.between(facts_.pt.reachable(v), since, k);
    if (writer_stages.empty()) return recompute(v, k, user);
    carryContainer(v, k, user, *writer_stages.rbegin(), last);
  }

  void resolveRootInput(Value* v, int index, int k, const Node* user) {
    auto [writer_stages, last] = facts_.writes.between(facts_.pt.reachable(v), -1, k);
    if (writer_stages.empty()) {
      stages_[k].root_inputs.insert(index);
      return;
    }
    int sender = *writer_stages.rbegin();
    if (!isTensor(v)) {
      refuse(fmt::format("model input {} is changed in place in stage {} ({}) and read in stage {} by {}; only "
                         "tensors can be sent between stages; move the split so that its writers and readers share a "
                         "stage",
                         describeValue(v), last->stage, facts_.describeWrite(*last), k, facts_.describeNode(user)));
    }
    if (!holdsTensor(sender, v)) refuseWriteThroughOtherValue(v, -1, k, sender, last);
    receiveTensor(k, v, sender);
  }

  [[noreturn]] void refuseWriteThroughOtherValue(const Value* v, int p, int k, int sender, const Writer* last) const {
    std::string made = p < 0 ? "is a model input" : fmt::format("is made in stage {}", p);
    refuse(fmt::format("tensor {} {} and read in stage {}, but stage {} changes its memory in place through another "
                       "value ({}) and does not hold it, so no stage can send the changed tensor; move the split so "
                       "that the writer and the readers of %{} share a stage",
                       describeValue(v), made, k, sender, facts_.describeWrite(*last), v->debugName()));
  }

  // A non-tensor value no earlier stage changed: compute it again in stage k.
  void recompute(Value* v, int k, const Node* user) {
    Node* producer = v->node();
    const int p = facts_.stage_of.at(producer);
    if (!producer->blocks().empty() || producer->hasSideEffects()) {
      // Named by the code that made it, not by its graph id: that is what the user can find.
      refuse(fmt::format("a {} made in stage {} by {} is used in stage {} by {}, but only tensors can cross stages and "
                         "it cannot be recomputed there ({}); move the split point so that its producer and its users "
                         "share a stage",
                         v->type()->repr_str(), p, facts_.describeNode(producer), k, facts_.describeNode(user),
                         producer->blocks().empty() ? "a module call or an op with side effects runs only once"
                                                    : "it comes out of an if or a loop"));
    }
    const auto& writes = facts_.pt.writes(producer);
    if (!writes.empty()) {
      refuse(fmt::format("value {} is made in stage {} by {}, which also changes {} in place, and is used in stage {} "
                         "by {}; only tensors cross stages, and computing it again there would repeat the change; move "
                         "the split so that %{} and its users share a stage",
                         describeValue(v), p, facts_.describeNode(producer),
                         facts_.describeObject(writes.front().object), k, facts_.describeNode(user), v->debugName()));
    }
    auto [writer_stages, last] = facts_.writes.between(facts_.pt.reads(producer), facts_.position.at(producer), k);
    if (!writer_stages.empty()) {
      refuse(fmt::format("value {} is made in stage {} by {} and used in stage {} by {}; only tensors cross stages, so "
                         "stage {} would compute it again, but {}, which it reads, is changed in between in stage {} "
                         "({}); move the split so that %{} and its users share a stage",
                         describeValue(v), p, facts_.describeNode(producer), k, facts_.describeNode(user), k,
                         facts_.describeObject(firstWritten(producer, last)), last->stage, facts_.describeWrite(*last),
                         v->debugName()));
    }
    stages_[k].emit.insert(producer);
    for (Value* in : producer->inputs()) resolve(in, k, producer);
  }

  // The first object `producer` reads that `writer` writes (for messages).
  ObjectId firstWritten(const Node* producer, const Writer* writer) const {
    auto reads = facts_.pt.reads(producer);
    for (const MemoryWrite& w : facts_.pt.writes(writer->node)) {
      if (std::find(reads.begin(), reads.end(), w.object) != reads.end()) return w.object;
    }
    return reads.front();
  }

  // ---- containers ----------------------------------------------------------

  void carryContainer(Value* v, int k, const Node* user, int sender, const Writer* last) {
    auto points_to = facts_.pt.pointsTo(v);
    if (points_to.size() != 1) {
      refuseContainer(facts_, v, k, user,
                      fmt::format("it may be one of {} different containers, so it cannot be rebuilt from its "
                                  "elements",
                                  points_to.size()));
    }
    const ObjectId object = points_to.front();
    const MemoryObject& obj = facts_.pt.object(object);
    const Node* creator = obj.kind == MemoryObject::Kind::kMade && obj.value ? obj.value->node() : nullptr;
    const bool is_list = creator && creator->kind() == c10::prim::ListConstruct;
    const bool is_dict = creator && creator->kind() == c10::prim::DictConstruct;
    if (!is_list && !is_dict) {
      refuseContainer(facts_, v, k, user,
                      fmt::format("only a list or dict made by a literal in forward can be sent as its tensors, and "
                                  "this is {}",
                                  facts_.describeObject(object)));
    }
    if ((is_list && !isTensorList(v->type())) || (is_dict && !isTensorDict(v->type()))) {
      refuseContainer(facts_, v, k, user,
                      fmt::format("stage {} changes it ({}), and only lists of tensors and dicts from str or int to "
                                  "tensors can be sent between stages",
                                  last->stage, facts_.describeWrite(*last)));
    }
    // The sender holds the container if it made it (or made it again) or rebuilt it.
    if (!stages_[sender].emit.count(creator) && !stages_[sender].rebuilt.count(object)) {
      refuseContainer(facts_, v, k, user,
                      fmt::format("stage {} changes it ({}) without holding it", sender, facts_.describeWrite(*last)));
    }
    ContainerContents contents = contentsAtEndOf(facts_, sender, object, creator, v, k, user);
    RebuiltContainer rebuilt;
    rebuilt.is_dict = is_dict;
    rebuilt.names = {creator->output()};
    if (v != creator->output()) rebuilt.names.push_back(v);
    for (size_t i = 0; i < contents.elements.size(); ++i) {
      Receipt r;
      r.sender = sender;
      r.what.kind = is_dict ? Sent::Kind::kDictValue : Sent::Kind::kListElement;
      r.what.value = creator->output();
      r.what.index = static_cast<int64_t>(i);
      if (is_dict) r.what.key = contents.keys[i];
      r.objects = facts_.pt.pointsTo(contents.elements[i]);
      r.description = is_dict ? fmt::format("{}[{}]", describeValue(v), contents.key_text[i].substr(2))
                              : fmt::format("{}[{}]", describeValue(v), i);
      rebuilt.elements.push_back(addReceipt(k, std::move(r)));
      if (is_dict) rebuilt.keys.push_back(contents.keys[i]);
    }
    stages_[k].rebuilt[object] = static_cast<int>(stages_[k].containers.size());
    stages_[k].containers.push_back(std::move(rebuilt));
  }

  // ---- model outputs -------------------------------------------------------

  std::vector<ValueSource> planModelOutputs() {
    std::vector<Value*> outputs;
    Value* out = facts_.graph.outputs()[0];
    if (facts_.returns_tuple) {
      outputs.assign(out->node()->inputs().begin(), out->node()->inputs().end());
    } else {
      outputs.assign(facts_.graph.outputs().begin(), facts_.graph.outputs().end());
    }
    std::vector<ValueSource> sources;
    for (size_t i = 0; i < outputs.size(); ++i) {
      Value* v = outputs[i];
      auto root = facts_.root_index.find(v);
      if (root == facts_.root_index.end()) {
        if (!isTensor(v)) {
          refuse(fmt::format("model output {} is {}; pipeforge splits models whose outputs are tensors or a tuple of "
                             "tensors",
                             i, v->type()->repr_str()));
        }
        if (frontend::isFreeNode(v->node())) {
          refuse(fmt::format("model output {} is a parameter or constant read; return a computed tensor", i));
        }
      }
      const int p = root == facts_.root_index.end() ? facts_.stage_of.at(v->node()) : -1;
      auto [writer_stages, last] =
          facts_.writes.between(facts_.pt.reachable(v), facts_.positionOf(v), facts_.num_stages);
      int sender = writer_stages.empty() ? p : std::max(p, *writer_stages.rbegin());
      if (sender < 0) {
        sources.push_back({ValueSource::Kind::kInput, -1, root->second});
        continue;
      }
      if (sender != p && !holdsTensor(sender, v)) refuseWriteThroughOtherValue(v, p, facts_.num_stages, sender, last);
      Sent what;
      what.kind = Sent::Kind::kValue;
      what.value = v;
      addExport(sender, what);
      sources.push_back({ValueSource::Kind::kStage, sender, -1});  // index filled by finish()
      output_sent_.push_back(what);
    }
    return sources;
  }

  const SplitFacts facts_;
  AttributeWriters attribute_writers_;
  std::vector<StageState> stages_;
  std::vector<std::vector<Sent>> exports_;
  std::vector<Sent> output_sent_;  // model outputs sent by stages, in order
};

}  // namespace

DataflowPlan planDataflow(const frontend::OpenedModel& model, const frontend::ModelDag& dag,
                          const partitioner::Partition& partition) {
  return DataflowPlanner(model, dag, partition).run();
}

}  // namespace pipeforge::stage
