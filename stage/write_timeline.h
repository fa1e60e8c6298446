// Who changes which memory, and when: the in-place writes of a split's
// top-level nodes, in graph order, with the stage each runs in.
//
// Torch-free: the planner (stage_dataflow.cpp) asks it which earlier stages
// changed the memory a value may be, and which write was the last
// (Note [Mutable state across stages]).
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "stage/points_to.h"

namespace pipeforge::stage {

// One top-level node's in-place write of one memory object.
struct Writer {
  int position = 0;                        // the node's place in graph order
  int stage = 0;                           // the stage that runs it
  const torch::jit::Node* node = nullptr;  // the top-level node (a call, if or loop holding the op)
  std::string op;                          // MemoryWrite::op: "aten::add_ at model.py:16 inside `counter`"
};

class WriteTimeline {
 public:
  // Records a write; writes of one object must come in graph order.
  void add(ObjectId object, Writer writer);

  struct WritesBetween {
    std::set<int> stages;          // the stages that write
    const Writer* last = nullptr;  // the write latest in graph order; null when none
  };
  // The stages in [0, before) that write any of `objects` after `position`,
  // with the last such write.
  WritesBetween between(const std::vector<ObjectId>& objects, int position, int before) const;

  // Whether any node writes `object`.
  bool isWritten(ObjectId object) const;

  // Every written object (ascending) and its writes, in graph order.
  const std::map<ObjectId, std::vector<Writer>>& byObject() const { return writers_; }

 private:
  std::map<ObjectId, std::vector<Writer>> writers_;
};

}  // namespace pipeforge::stage
