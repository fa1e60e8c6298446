// The runtime's StageSharding (runtime/stage_sharding.h) over a rank's
// sharded stages: ZeRO stage 2's gradients reduced into pieces at each
// stage's REDUCE_GRAD (Note [Sharded gradients]).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "runtime/stage_sharding.h"
#include "sharding/sharded_stage.h"

namespace pipeforge::sharding {

class ZeroSharding final : public runtime::StageSharding {
 public:
  // `stages`: this rank's sharded stages by index; not owned.
  explicit ZeroSharding(std::map<int, ShardedStage*> stages) : stages_(std::move(stages)) {}

  void reduceGradients(int stage) override { stages_.at(stage)->reduceGradients(); }
  at::Tensor heldGradient(int stage, const std::string& fqn) override {
    return stages_.at(stage)->heldGradient(fqn);
  }
  std::vector<at::Tensor> heldGradients() override {
    std::vector<at::Tensor> out;
    for (const auto& [index, stage] : stages_) {
      for (const at::Tensor& t : stage->gradientBuffers()) out.push_back(t);
    }
    return out;
  }

 private:
  std::map<int, ShardedStage*> stages_;
};

}  // namespace pipeforge::sharding
