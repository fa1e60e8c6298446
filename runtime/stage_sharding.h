// What the executor asks of a data-parallel sharding of the stages
// (ZeRO stage 2 and up, implemented in sharding/) at the actions that name
// it. Without one, REDUCE_GRAD all-reduces a stage's whole gradients over
// the replicas, and every rank keeps them whole until the optimizer steps.
#pragma once

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
};

}  // namespace pipeforge::runtime
