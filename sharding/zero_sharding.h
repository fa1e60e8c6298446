// The runtime's StageSharding (runtime/stage_sharding.h) over a rank's
// sharded stages: ZeRO stage 2's gradients reduced into pieces at each
// stage's REDUCE_GRAD (Note [Sharded gradients]), and stage 3's parameters
// gathered at UNSHARD and released at RESHARD (Note [Sharded parameters]).
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
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
  void unshard(int stage) override { at(stage).unshard(); }
  void ensureUnsharded(int stage) override { at(stage).waitUnsharded(); }
  void reshard(int stage) override { at(stage).reshard(); }
  void reshardAll() override {
    for (auto& [index, stage] : stages_) stage->reshard();
  }
  std::int64_t unshardedBytes() const override {
    std::int64_t bytes = 0;
    for (const auto& [index, stage] : stages_) bytes += stage->unshardedBytes();
    return bytes;
  }
  std::vector<at::Tensor> heldGradients() override {
    std::vector<at::Tensor> out;
    for (const auto& [index, stage] : stages_) {
      for (const at::Tensor& t : stage->gradientBuffers()) out.push_back(t);
    }
    return out;
  }

 private:
  ShardedStage& at(int stage) {
    auto it = stages_.find(stage);
    if (it == stages_.end()) {
      throw std::out_of_range("the schedule names stage " + std::to_string(stage) +
                              ", which this rank does not hold, in an UNSHARD, RESHARD or compute action");
    }
    return *it->second;
  }

  std::map<int, ShardedStage*> stages_;
};

}  // namespace pipeforge::sharding
