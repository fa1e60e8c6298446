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

class DataflowPlanner {
 public:
  DataflowPlanner(const frontend::OpenedModel& model, const frontend::ModelDag& dag,
                  const partitioner::Partition& partition)
      : model_(model), graph_(model.graph()), pt_(model.module(), model.graph()), num_stages_(partition.num_stages) {
    const size_t num_vertices = boost::num_vertices(dag.graph);
    for (size_t v = 0; v < num_vertices; ++v) {
      if (const Node* n = dag.graph[v].node) stage_of_[n] = partition.stage_of_vertex[v];
    }
    int position = 0;
    for (const Node* n : graph_.nodes()) position_[n] = position++;
    for (size_t i = 1; i < graph_.inputs().size(); ++i) root_index_[graph_.inputs()[i]] = static_cast<int>(i - 1);
    for (const Node* n : graph_.nodes()) {
      auto home = stage_of_.find(n);
      if (home == stage_of_.end()) continue;
      for (const MemoryWrite& w : pt_.writes(n)) writes_.add(w.object, {position_.at(n), home->second, n, w.op});
    }
    stages_.resize(num_stages_);
    exports_.resize(num_stages_);
    for (size_t v = 0; v < num_vertices; ++v) {
      const auto& d = dag.graph[v];
      if (!d.node || d.kind == frontend::DagNodeKind::kMarker) continue;
      stages_[partition.stage_of_vertex[v]].emit.insert(d.node);
    }
    returns_tuple_ = dag.returns_tuple;
  }

  DataflowPlan run() {
    planAttributeWriters();
    for (int k = 0; k < num_stages_; ++k) {
      for (const Node* n : emitted(k)) {
        for (Value* in : frontend::externalInputs(const_cast<Node*>(n))) resolve(in, k, n);
      }
    }
    DataflowPlan plan;
    plan.model_outputs = planModelOutputs();
    checkAttributeHolders();
    for (int s = 0; s < num_stages_; ++s) checkSingleCopy(s);
    finish(plan);
    return plan;
  }

 private:
  // ---- facts --------------------------------------------------------------

  int positionOf(const Value* v) const {
    if (root_index_.count(v)) return -1;
    return position_.at(v->node());
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
    return fmt::format("{} in the code of {}", what, quoted(model_.ownerOf(n)));
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
    const MemoryObject& obj = pt_.object(o);
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

  // The nodes stage `s` emits, in graph order.
  std::vector<const Node*> emitted(int s) const {
    std::vector<const Node*> nodes(stages_[s].emit.begin(), stages_[s].emit.end());
    std::sort(nodes.begin(), nodes.end(),
              [&](const Node* a, const Node* b) { return position_.at(a) < position_.at(b); });
    return nodes;
  }

  bool holdsTensor(int s, const Value* v) const {
    auto root = root_index_.find(v);
    if (root != root_index_.end()) return stages_[s].root_inputs.count(root->second) != 0;
    auto home = stage_of_.find(v->node());
    if (home != stage_of_.end() && home->second == s) return true;
    return stages_[s].received_value.count(v) != 0;
  }

  [[noreturn]] void refuse(const std::string& message) const { throw StageBuildError(message); }

  // ---- module attributes ---------------------------------------------------

  void planAttributeWriters() {
    for (const auto& [object, writers] : writes_.byObject()) {
      if (!pt_.object(object).persistent()) continue;
      std::map<int, const Writer*> by_stage;
      for (const Writer& w : writers) by_stage.emplace(w.stage, &w);
      if (by_stage.size() > 1) {
        auto first = by_stage.begin();
        auto second = std::next(first);
        refuse(fmt::format("{} is changed in place in stage {} ({}) and in stage {} ({}); each stage would keep its "
                           "own copy and the copies would drift apart; move the split so that every writer of `{}` "
                           "is in one stage",
                           describeObject(object), first->first, describeWrite(*first->second), second->first,
                           describeWrite(*second->second), pt_.object(object).name));
      }
      attribute_writer_[object] = by_stage.begin()->second;
    }
  }

  // A stage other than the writer may read an attribute only as a received
  // copy (Note [Mutable state across stages]).
  void checkAttributeHolders() const {
    for (const auto& [object, writer] : attribute_writer_) {
      const MemoryObject& obj = pt_.object(object);
      for (int l = 0; l < num_stages_; ++l) {
        if (l == writer->stage) continue;
        std::string reader;
        for (const Node* n : emitted(l)) {
          auto touched = pt_.attributesTouched(n);
          if (std::find(touched.begin(), touched.end(), object) != touched.end()) {
            reader = "by " + describeNode(n);
            break;
          }
        }
        auto held = stages_[l].held_attribute.find(object);
        if (reader.empty() && held != stages_[l].held_attribute.end()) {
          reader = fmt::format("as `{}` by {}", frontend::attributePath(held->second.first).value_or(obj.name),
                               describeNode(held->second.second));
        }
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
                           describeObject(object), writer->stage, describeWrite(*writer), l, reader, why, l,
                           obj.name));
      }
    }
  }

  bool sendsAttribute(ObjectId object, int k) const {
    auto it = attribute_writer_.find(object);
    if (it == attribute_writer_.end() || it->second->stage >= k) return false;
    const MemoryObject& obj = pt_.object(object);
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
    r.objects = pt_.pointsTo(v);
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
    r.sender = attribute_writer_.at(object)->stage;
    r.what.kind = Sent::Kind::kAttribute;
    r.what.fqn = frontend::attributePath(getattr).value_or(pt_.object(object).name);
    r.binds = {getattr};
    r.objects = {object};
    r.description = "`" + r.what.fqn + "`";
    state.received_attribute[object] = addReceipt(k, std::move(r));
  }

  void resolve(Value* v, int k, const Node* user) {
    if (v == graph_.inputs()[0]) return;
    auto root = root_index_.find(v);
    if (root != root_index_.end()) return resolveRootInput(v, root->second, k, user);
    Node* producer = v->node();
    if (frontend::isFreeNode(producer)) {
      if (producer->kind() == c10::prim::GetAttr && producer->owningBlock() == graph_.block()) {
        ObjectId attribute = pt_.attributeOf(v);
        if (attribute >= 0 && sendsAttribute(attribute, k)) return receiveAttribute(k, attribute, v);
        if (attribute >= 0) stages_[k].held_attribute.emplace(attribute, std::make_pair(v, user));
      }
      for (Value* in : producer->inputs()) resolve(in, k, user);
      return;
    }
    auto home = stage_of_.find(producer);
    PIPEFORGE_CHECK(home != stage_of_.end(), "value " + describeValue(v) + " has no stage");
    const int p = home->second;
    if (p == k || stages_[k].emit.count(producer)) return;
    if (isTensor(v)) {
      auto [writer_stages, last] = writes_.between(pt_.reachable(v), position_.at(producer), k);
      int sender = writer_stages.empty() ? p : std::max(p, *writer_stages.rbegin());
      if (sender != p && !holdsTensor(sender, v)) refuseWriteThroughOtherValue(v, p, k, sender, last);
      return receiveTensor(k, v, sender);
    }
    auto points_to = pt_.pointsTo(v);
    // Every value naming one container (`feats`, and `feats += [h]`'s result)
    // is judged from where the container was made, so they all agree.
    int since = position_.at(producer);
    if (points_to.size() == 1) {
      auto rebuilt = stages_[k].rebuilt.find(points_to.front());
      if (rebuilt != stages_[k].rebuilt.end()) {
        auto& names = stages_[k].containers[rebuilt->second].names;
        if (std::find(names.begin(), names.end(), v) == names.end()) names.push_back(v);
        return;
      }
      const MemoryObject& obj = pt_.object(points_to.front());
      if (obj.kind == MemoryObject::Kind::kMade && obj.value && position_.count(obj.value->node())) {
        since = std::min(since, position_.at(obj.value->node()));
      }
    }
    auto [writer_stages, last] = writes_.between(pt_.reachable(v), since, k);
    if (writer_stages.empty()) return recompute(v, k, user);
    carryContainer(v, k, user, *writer_stages.rbegin(), last);
  }

  void resolveRootInput(Value* v, int index, int k, const Node* user) {
    auto [writer_stages, last] = writes_.between(pt_.reachable(v), -1, k);
    if (writer_stages.empty()) {
      stages_[k].root_inputs.insert(index);
      return;
    }
    int sender = *writer_stages.rbegin();
    if (!isTensor(v)) {
      refuse(fmt::format("model input {} is changed in place in stage {} ({}) and read in stage {} by {}; only "
                         "tensors can be sent between stages; move the split so that its writers and readers share a "
                         "stage",
                         describeValue(v), last->stage, describeWrite(*last), k, describeNode(user)));
    }
    if (!holdsTensor(sender, v)) refuseWriteThroughOtherValue(v, -1, k, sender, last);
    receiveTensor(k, v, sender);
  }

  [[noreturn]] void refuseWriteThroughOtherValue(const Value* v, int p, int k, int sender, const Writer* last) const {
    std::string made = p < 0 ? "is a model input" : fmt::format("is made in stage {}", p);
    refuse(fmt::format("tensor {} {} and read in stage {}, but stage {} changes its memory in place through another "
                       "value ({}) and does not hold it, so no stage can send the changed tensor; move the split so "
                       "that the writer and the readers of %{} share a stage",
                       describeValue(v), made, k, sender, describeWrite(*last), v->debugName()));
  }

  // A non-tensor value no earlier stage changed: compute it again in stage k.
  void recompute(Value* v, int k, const Node* user) {
    Node* producer = v->node();
    const int p = stage_of_.at(producer);
    if (!producer->blocks().empty() || producer->hasSideEffects()) {
      // Named by the code that made it, not by its graph id: that is what the user can find.
      refuse(fmt::format("a {} made in stage {} by {} is used in stage {} by {}, but only tensors can cross stages and "
                         "it cannot be recomputed there ({}); move the split point so that its producer and its users "
                         "share a stage",
                         v->type()->repr_str(), p, describeNode(producer), k, describeNode(user),
                         producer->blocks().empty() ? "a module call or an op with side effects runs only once"
                                                    : "it comes out of an if or a loop"));
    }
    const auto& writes = pt_.writes(producer);
    if (!writes.empty()) {
      refuse(fmt::format("value {} is made in stage {} by {}, which also changes {} in place, and is used in stage {} "
                         "by {}; only tensors cross stages, and computing it again there would repeat the change; move "
                         "the split so that %{} and its users share a stage",
                         describeValue(v), p, describeNode(producer), describeObject(writes.front().object), k,
                         describeNode(user), v->debugName()));
    }
    auto [writer_stages, last] = writes_.between(pt_.reads(producer), position_.at(producer), k);
    if (!writer_stages.empty()) {
      refuse(fmt::format("value {} is made in stage {} by {} and used in stage {} by {}; only tensors cross stages, so "
                         "stage {} would compute it again, but {}, which it reads, is changed in between in stage {} "
                         "({}); move the split so that %{} and its users share a stage",
                         describeValue(v), p, describeNode(producer), k, describeNode(user), k,
                         describeObject(firstWritten(producer, last)), last->stage, describeWrite(*last),
                         v->debugName()));
    }
    stages_[k].emit.insert(producer);
    for (Value* in : producer->inputs()) resolve(in, k, producer);
  }

  // The first object `producer` reads that `writer` writes (for messages).
  ObjectId firstWritten(const Node* producer, const Writer* writer) const {
    auto reads = pt_.reads(producer);
    for (const MemoryWrite& w : pt_.writes(writer->node)) {
      if (std::find(reads.begin(), reads.end(), w.object) != reads.end()) return w.object;
    }
    return reads.front();
  }

  // ---- containers ----------------------------------------------------------

  [[noreturn]] void refuseContainer(const Value* v, int k, const Node* user, const std::string& why) const {
    const char* what = v->type()->cast<c10::DictType>() ? "dict" : v->type()->cast<c10::ListType>() ? "list" : "value";
    refuse(fmt::format("{} is read in stage {} by {} after an earlier stage changed it in place; {}; move the split so "
                       "that the {}'s writers and readers share a stage",
                       describeValue(v), k, describeNode(user), why, what));
  }

  void carryContainer(Value* v, int k, const Node* user, int sender, const Writer* last) {
    auto points_to = pt_.pointsTo(v);
    if (points_to.size() != 1) {
      refuseContainer(v, k, user,
                      fmt::format("it may be one of {} different containers, so it cannot be rebuilt from its "
                                  "elements",
                                  points_to.size()));
    }
    const ObjectId object = points_to.front();
    const MemoryObject& obj = pt_.object(object);
    const Node* creator = obj.kind == MemoryObject::Kind::kMade && obj.value ? obj.value->node() : nullptr;
    const bool is_list = creator && creator->kind() == c10::prim::ListConstruct;
    const bool is_dict = creator && creator->kind() == c10::prim::DictConstruct;
    if (!is_list && !is_dict) {
      refuseContainer(v, k, user,
                      fmt::format("only a list or dict made by a literal in forward can be sent as its tensors, and "
                                  "this is {}",
                                  describeObject(object)));
    }
    if ((is_list && !isTensorList(v->type())) || (is_dict && !isTensorDict(v->type()))) {
      refuseContainer(v, k, user,
                      fmt::format("stage {} changes it ({}), and only lists of tensors and dicts from str or int to "
                                  "tensors can be sent between stages",
                                  last->stage, describeWrite(*last)));
    }
    // The sender holds the container if it made it (or made it again) or rebuilt it.
    if (!stages_[sender].emit.count(creator) && !stages_[sender].rebuilt.count(object)) {
      refuseContainer(v, k, user,
                      fmt::format("stage {} changes it ({}) without holding it", sender, describeWrite(*last)));
    }
    ContainerContents contents = contentsAtEndOf(sender, object, creator, v, k, user);
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
      r.objects = pt_.pointsTo(contents.elements[i]);
      r.description = is_dict ? fmt::format("{}[{}]", describeValue(v), contents.key_text[i].substr(2))
                              : fmt::format("{}[{}]", describeValue(v), i);
      rebuilt.elements.push_back(addReceipt(k, std::move(r)));
      if (is_dict) rebuilt.keys.push_back(contents.keys[i]);
    }
    stages_[k].rebuilt[object] = static_cast<int>(stages_[k].containers.size());
    stages_[k].containers.push_back(std::move(rebuilt));
  }

  // The elements of a list or dict literal at the end of stage `last_stage`
  // (Note [Replaying a container's changes]). Refuses what it cannot replay.
  ContainerContents contentsAtEndOf(int last_stage, ObjectId object, const Node* creator, const Value* v, int k,
                                    const Node* user) const {
    ContainerContents c;
    if (auto why = readContainerLiteral(*creator, c)) refuseContainer(v, k, user, *why);
    const int start = position_.at(creator);
    for (const Node* n : graph_.nodes()) {
      if (position_.at(n) <= start) continue;
      auto home = stage_of_.find(n);
      if (home == stage_of_.end() || home->second > last_stage) continue;
      const auto& writes = pt_.writes(n);
      bool changes = std::any_of(writes.begin(), writes.end(), [&](const MemoryWrite& w) { return w.object == object; });
      if (changes) replay(n, object, creator->kind() == c10::prim::DictConstruct, c, v, k, user);
    }
    return c;
  }

  void replay(const Node* n, ObjectId object, bool is_dict, ContainerContents& c, const Value* v, int k,
              const Node* user) const {
    auto cannot = [&](const std::string& why) {
      std::string op = describeOp(n);
      for (const MemoryWrite& w : pt_.writes(n)) {
        if (w.object == object) op = w.op;
      }
      refuseContainer(v, k, user,
                      fmt::format("stage {} changes it ({}) {}, and only a {} whose {} known when splitting can be "
                                  "sent between stages as its tensors",
                                  stage_of_.at(n), describeWrite(n, op), why, is_dict ? "dict" : "list",
                                  is_dict ? "keys are" : "length is"));
    };
    if (!n->blocks().empty() || n->kind() == c10::prim::CallMethod || n->kind() == c10::prim::CallFunction) {
      cannot("where it may change any number of times");
    }
    if (n->inputs().empty() || pt_.pointsTo(n->input(0)) != std::vector<ObjectId>{object}) {
      cannot("through a value that may also be another container");
    }
    auto is_changed_in_place = [&](const Value* other) {
      auto objects = pt_.reachable(other);
      return std::any_of(objects.begin(), objects.end(), [&](ObjectId o) { return writes_.isWritten(o); });
    };
    if (auto why = replayContainerChange(*n, is_dict, c, is_changed_in_place)) cannot(*why);
  }

  // ---- model outputs -------------------------------------------------------

  std::vector<ValueSource> planModelOutputs() {
    std::vector<Value*> outputs;
    Value* out = graph_.outputs()[0];
    if (returns_tuple_) {
      outputs.assign(out->node()->inputs().begin(), out->node()->inputs().end());
    } else {
      outputs.assign(graph_.outputs().begin(), graph_.outputs().end());
    }
    std::vector<ValueSource> sources;
    for (size_t i = 0; i < outputs.size(); ++i) {
      Value* v = outputs[i];
      auto root = root_index_.find(v);
      if (root == root_index_.end()) {
        if (!isTensor(v)) {
          refuse(fmt::format("model output {} is {}; pipeforge splits models whose outputs are tensors or a tuple of "
                             "tensors",
                             i, v->type()->repr_str()));
        }
        if (frontend::isFreeNode(v->node())) {
          refuse(fmt::format("model output {} is a parameter or constant read; return a computed tensor", i));
        }
      }
      const int p = root == root_index_.end() ? stage_of_.at(v->node()) : -1;
      auto [writer_stages, last] = writes_.between(pt_.reachable(v), positionOf(v), num_stages_);
      int sender = writer_stages.empty() ? p : std::max(p, *writer_stages.rbegin());
      if (sender < 0) {
        sources.push_back({ValueSource::Kind::kInput, -1, root->second});
        continue;
      }
      if (sender != p && !holdsTensor(sender, v)) refuseWriteThroughOtherValue(v, p, num_stages_, sender, last);
      Sent what;
      what.kind = Sent::Kind::kValue;
      what.value = v;
      addExport(sender, what);
      sources.push_back({ValueSource::Kind::kStage, sender, -1});  // index filled by finish()
      output_sent_.push_back(what);
    }
    return sources;
  }

  // ---- copies --------------------------------------------------------------

  // A stage must not write memory that reaches it by two ways (see the Note).
  void checkSingleCopy(int s) const {
    const StageState& state = stages_[s];
    std::vector<std::pair<std::string, std::vector<ObjectId>>> ways;
    for (int index : state.root_inputs) {
      const Value* in = graph_.inputs()[index + 1];
      ways.emplace_back("model input " + describeValue(in), pt_.pointsTo(in));
    }
    for (const Receipt& r : state.receipts) ways.emplace_back(r.description, r.objects);
    for (const auto& [object, index] : state.rebuilt) {
      ways.emplace_back(describeValue(state.containers[index].names.back()), std::vector<ObjectId>{object});
    }
    std::set<ObjectId> held;
    for (const Node* n : state.emit) {
      for (ObjectId o : pt_.attributesTouched(n)) held.insert(o);
    }
    for (const auto& [object, getattr] : state.held_attribute) held.insert(object);
    for (ObjectId o : held) ways.emplace_back(describeObject(o), std::vector<ObjectId>{o});

    for (const Node* n : emitted(s)) {
      if (stage_of_.at(n) != s) continue;
      for (const MemoryWrite& w : pt_.writes(n)) {
        std::vector<std::string> reaching;
        for (const auto& [description, objects] : ways) {
          if (std::find(objects.begin(), objects.end(), w.object) != objects.end()) reaching.push_back(description);
        }
        if (reaching.size() < 2) continue;
        refuse(fmt::format("stage {} changes {} in place ({}), but that memory reaches stage {} twice, as {} and as {}; "
                           "after the split these are two copies and the change would reach only one; move the split "
                           "so that they are made and changed in one stage",
                           s, describeObject(w.object), describeWrite(n, w.op), s, reaching[0], reaching[1]));
      }
    }
  }

  // ---- the plan ------------------------------------------------------------

  // Sort key of what a stage sends: values it makes (graph order, as always),
  // then values it passes on, container elements, attributes.
  std::tuple<int, int, int64_t, std::string> exportKey(int s, const Sent& what) const {
    switch (what.kind) {
      case Sent::Kind::kValue: {
        auto home = stage_of_.find(what.value->node());
        bool own = home != stage_of_.end() && home->second == s && !root_index_.count(what.value);
        return {own ? 0 : 1, positionOf(what.value), static_cast<int64_t>(what.value->offset()), ""};
      }
      case Sent::Kind::kListElement:
      case Sent::Kind::kDictValue:
        return {2, positionOf(what.value), what.index, ""};
      case Sent::Kind::kAttribute:
        return {3, 0, 0, what.fqn};
    }
    return {4, 0, 0, ""};
  }

  void finish(DataflowPlan& plan) {
    plan.stages.resize(num_stages_);
    for (int s = 0; s < num_stages_; ++s) {
      auto& list = exports_[s];
      std::sort(list.begin(), list.end(),
                [&](const Sent& a, const Sent& b) { return exportKey(s, a) < exportKey(s, b); });
      plan.stages[s].outputs = list;
    }
    auto exportIndex = [&](int s, const Sent& what) {
      const auto& list = exports_[s];
      return static_cast<int>(std::find(list.begin(), list.end(), what) - list.begin());
    };
    for (int k = 0; k < num_stages_; ++k) {
      StageState& state = stages_[k];
      StageDataflow& out = plan.stages[k];
      out.emit = emitted(k);
      for (int index : state.root_inputs) {
        StageInputPlan in;
        in.source = {ValueSource::Kind::kInput, -1, index};
        in.what.value = graph_.inputs()[index + 1];
        in.binds = {in.what.value};
        out.inputs.push_back(std::move(in));
      }
      std::vector<int> order(state.receipts.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
      auto sourceOf = [&](int i) {
        const Receipt& r = state.receipts[i];
        return std::make_pair(r.sender, exportIndex(r.sender, r.what));
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
    }
    for (size_t i = 0, next = 0; i < plan.model_outputs.size(); ++i) {
      ValueSource& src = plan.model_outputs[i];
      if (src.kind != ValueSource::Kind::kStage) continue;
      src.index = exportIndex(src.stage, output_sent_[next++]);
    }
  }

  const frontend::OpenedModel& model_;
  Graph& graph_;
  PointsTo pt_;
  const int num_stages_;
  bool returns_tuple_ = false;
  std::unordered_map<const Node*, int> stage_of_;  // home stage of every node that does work
  std::unordered_map<const Node*, int> position_;  // top-level nodes, graph order
  std::unordered_map<const Value*, int> root_index_;
  WriteTimeline writes_;
  std::map<ObjectId, const Writer*> attribute_writer_;
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
