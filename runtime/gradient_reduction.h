// Gradients across ranks after the backward: each stage's averaged over its
// data-parallel replicas (REDUCE_GRAD, or at the step's end), and each tied
// weight's summed over every stage that holds it.
#pragma once

#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace pipeforge::runtime {

class Communicator;
class StageSharding;
class StepTrace;

// One group of tied parameters (pipe.json "tied"), as seen from one rank.
struct TiedGroup {
  std::vector<std::pair<int, std::string>> local;  // (stage, fqn), one per local holder stage
  std::vector<int> ranks;                          // global ranks of all holders, sorted, this replica
  bool crosses_stages = false;                     // two or more holder stages
};

struct GradientReductionConfig {
  int dp_degree = 1;
  std::vector<int> dp_group;  // global ranks holding this rank's stages in every replica
  std::vector<TiedGroup> tied;
};

class GradientReducer {
 public:
  // A local stage's parameters by FQN, the tensors its module's own.
  using ParametersOf = std::function<std::vector<std::pair<std::string, at::Tensor>>(int stage)>;

  GradientReducer(Communicator& comm, GradientReductionConfig config, ParametersOf parameters_of);

  // With a sharding (ZeRO stage 2 and up), reduceStage hands each stage to
  // it and sumTied sums the pieces it holds. Not owned; null: none.
  void setSharding(StageSharding* sharding) { sharding_ = sharding; }

  // Forgets which stages this step reduced.
  void beginStep();
  // Averages stage `stage`'s gradients over the data-parallel replicas, once
  // per step (later calls do nothing); parameters without a gradient
  // contribute zeros and get the average. Nothing without data parallelism.
  void reduceStage(int stage, StepTrace& trace);
  // Gives every local holder of a tied weight that crosses stages the sum of
  // their gradients, over the ranks of the group when it spans several.
  void sumTied(StepTrace& trace);

 private:
  Communicator& comm_;
  GradientReductionConfig cfg_;
  ParametersOf parameters_of_;
  std::set<int> reduced_;  // stages reduced this step
  StageSharding* sharding_ = nullptr;
};

}  // namespace pipeforge::runtime
