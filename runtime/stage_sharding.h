// What the executor asks of a data-parallel sharding of the stages
// (ZeRO stage 2 and up, implemented in sharding/) at the actions that name
// it. Without one, REDUCE_GRAD all-reduces a stage's whole gradients over
// the replicas, and every rank keeps them whole until the optimizer steps;
// UNSHARD and RESHARD do nothing unless the sharding holds the parameters
// in pieces (ZeRO stage 3).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace pipeforge::runtime {

class StageSharding {
 public:
  virtual ~StageSharding() = default;

  // The stage's last backward of the step ran (REDUCE_GRAD, or the step's
  // end for a program without one): reduce its gradients over the replicas,
  // averaged, keeping only this rank's pieces, and release the whole ones.
  // Once per stage and step.
  virtual void reduceGradients(int stage) = 0;
  // After reduceGradients: the gradient this rank holds for `stage`'s
  // parameter `fqn` (its piece, 1-D; undefined where it holds none). Tied
  // copies on other stages hold the same elements of the same group.
  virtual at::Tensor heldGradient(int stage, const std::string& fqn) = 0;
  // Every gradient this rank holds, each tensor once.
  virtual std::vector<at::Tensor> heldGradients() = 0;

  // UNSHARD: post the gathers that make `stage`'s parameters whole.
  virtual void unshard(int stage) { (void)stage; }
  // Before each compute action of `stage`: its parameters whole (waits for
  // the gathers UNSHARD posted, or gathers now when none was posted).
  virtual void ensureUnsharded(int stage) { (void)stage; }
  // RESHARD: `stage`'s whole parameters released, this rank's pieces kept.
  virtual void reshard(int stage) { (void)stage; }
  // The step's end: every stage resharded (the optimizer steps the pieces).
  virtual void reshardAll() {}
  // Bytes of whole parameters held now (not activations: Note [Activation memory]).
  virtual std::int64_t unshardedBytes() const { return 0; }
};

}  // namespace pipeforge::runtime
