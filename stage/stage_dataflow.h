// The dataflow of a split: what each stage computes, receives and sends.
//
// An analysis over the opened graph and its partition; build_stages.cpp
// turns it into stage graphs. Only tensors travel between stages. A value
// another stage needs is sent by the stage that last changed it; a list or
// dict of tensors travels as its tensors and is rebuilt where it is read; a
// buffer one stage changes in place travels to the later stages that read it;
// other non-tensor values (ints, sizes) are recomputed. What cannot be made
// exact is refused with a StageBuildError that names the op, the value, the
// modules and the fix (Note [Mutable state across stages] in the .cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "stage/manifest.h"

namespace torch::jit {
struct Node;
struct Value;
}  // namespace torch::jit

namespace pipeforge::frontend {
class OpenedModel;
struct ModelDag;
}  // namespace pipeforge::frontend

namespace pipeforge::partitioner {
struct Partition;
}

namespace pipeforge::stage {

// One tensor a stage sends: a value it holds, an element of a list or dict
// it holds, or the current value of a module attribute (a buffer).
struct Sent {
  enum class Kind { kValue, kListElement, kDictValue, kAttribute };
  Kind kind = Kind::kValue;
  // kValue: the tensor. kListElement / kDictValue: the container (the value
  // that made it, prim::ListConstruct / prim::DictConstruct). kAttribute: null.
  const torch::jit::Value* value = nullptr;
  int64_t index = 0;                       // kListElement
  const torch::jit::Value* key = nullptr;  // kDictValue: the key, a constant of the graph
  std::string fqn;                         // kAttribute: the attribute's name

  friend bool operator==(const Sent& a, const Sent& b) {
    return a.kind == b.kind && a.value == b.value && a.index == b.index && a.key == b.key && a.fqn == b.fqn;
  }
};

// One stage input: where it comes from, what it is, and the values of the
// original graph it stands for in this stage (a tensor; every top-level
// prim::GetAttr of a received attribute; none for a container element).
struct StageInputPlan {
  ValueSource source;
  Sent what;
  std::vector<const torch::jit::Value*> binds;
};

// A list or dict rebuilt from received elements at the start of a stage.
struct RebuiltContainer {
  bool is_dict = false;
  std::vector<const torch::jit::Value*> names;  // values of the original graph naming it
  std::vector<int> elements;                    // indexes into StageDataflow::inputs, in order
  std::vector<const torch::jit::Value*> keys;   // is_dict: one constant per element
};

struct StageDataflow {
  std::vector<const torch::jit::Node*> emit;  // graph order: the stage's nodes and recomputed producers
  std::vector<StageInputPlan> inputs;         // manifest order: model inputs, then by (stage, index)
  std::vector<RebuiltContainer> containers;
  std::vector<Sent> outputs;                  // manifest order
};

struct DataflowPlan {
  std::vector<StageDataflow> stages;
  std::vector<ValueSource> model_outputs;
};

DataflowPlan planDataflow(const frontend::OpenedModel& model, const frontend::ModelDag& dag,
                          const partitioner::Partition& partition);

}  // namespace pipeforge::stage
