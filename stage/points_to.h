// Which memory the values of a forward graph may share, and which nodes change it.
//
// An inclusion-based (Andersen) points-to analysis driven by TorchScript's
// alias annotations: `add_(Tensor(a!) self, ...) -> Tensor(a!)` writes `self`
// and returns it, `view(Tensor(a) self, ...) -> Tensor(a)` returns a value
// sharing `self`'s memory, `append(t[](a!) self, t(c -> *) el)` writes the list
// and puts `el` inside it, `__getitem__(t[](a) l, int i) -> t(*)` returns
// something inside `l`. Submodule calls are analysed in their callee's graph,
// once per call, so the writes a call makes (BatchNorm's running statistics,
// a counter's `add_`) are seen at the call. Ops the analysis cannot read
// (no schema, alias analysis CONSERVATIVE) write every input.
//
// For stage/ this answers: which top-level node changes a list, a tensor or a
// module attribute in place, and which values may reach the same memory
// (Note [Mutable state across stages] in stage_dataflow.cpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace torch::jit {
struct Graph;
struct Module;
struct Node;
struct Value;
}  // namespace torch::jit

namespace pipeforge::stage {

using ObjectId = int;

// One piece of memory: what a node made (a tensor, a list), a model input,
// a module attribute (a parameter, a buffer, an int), a tensor constant, or
// what a value passed in from outside holds (`kOpaque`).
struct MemoryObject {
  enum class Kind { kMade, kModelInput, kAttribute, kConstant, kOpaque };
  Kind kind = Kind::kMade;
  std::string name;                          // "%feats.1", "input x", "counter.count", ...
  std::vector<std::string> fqns;             // kAttribute: every name of it (tied names), sorted
  bool is_tensor = false;                    // kAttribute: a tensor (parameter, buffer or plain attribute)
  bool is_parameter = false;                 // kAttribute
  const torch::jit::Value* value = nullptr;  // kMade by a top-level node / kModelInput: that value
  // Lives longer than one forward: a change is seen by the next forward.
  bool persistent() const { return kind == Kind::kAttribute || kind == Kind::kConstant || kind == Kind::kOpaque; }
};

// An in-place change, attributed to the top-level node that makes it (the
// node itself, or the if / loop / submodule call that contains it).
struct MemoryWrite {
  ObjectId object = 0;
  std::string op;  // "aten::add_ at model.py:16 inside `counter`"
};

// "aten::add_ at model.py:16": an op and where its source is, for messages.
std::string describeOp(const torch::jit::Node* node);

class PointsTo {
 public:
  // Analyses `graph`, the forward of `module` (or an opened copy of it).
  PointsTo(const torch::jit::Module& module, torch::jit::Graph& graph);
  ~PointsTo();
  PointsTo(PointsTo&&) noexcept;
  PointsTo& operator=(PointsTo&&) noexcept;

  const MemoryObject& object(ObjectId id) const;
  size_t numObjects() const;
  // What a value of the top-level graph may be; empty for values that are
  // never shared (ints, strings, modules).
  std::vector<ObjectId> pointsTo(const torch::jit::Value* value) const;
  // pointsTo(value) and everything inside it, transitively (a list and its tensors).
  std::vector<ObjectId> reachable(const torch::jit::Value* value) const;
  // What may be inside `object` (a list's elements).
  std::vector<ObjectId> contents(ObjectId object) const;
  // What a top-level node changes in place, with its blocks and the calls it makes.
  const std::vector<MemoryWrite>& writes(const torch::jit::Node* node) const;
  // What a top-level node may read: everything reachable from its inputs,
  // and the module attributes it (or a call it makes) reads.
  std::vector<ObjectId> reads(const torch::jit::Node* node) const;
  // Module attributes a top-level node reads or writes, also inside its
  // blocks and calls (not through its inputs).
  std::vector<ObjectId> attributesTouched(const torch::jit::Node* node) const;
  // The attribute object a top-level prim::GetAttr output names, or -1.
  ObjectId attributeOf(const torch::jit::Value* value) const;
  // Ops with tracked inputs or outputs that the analysis could not read (no
  // schema, alias analysis CONSERVATIVE), taken to write every input:
  // "prim::Enter at model.py:3". Each makes splits more likely to be refused.
  const std::vector<std::string>& unreadOps() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pipeforge::stage
