#include "checkpoint/checkpoint_weights.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/StringUtil.h>
#include <fmt/format.h>

#include "checkpoint/checkpoint.h"
#include "runtime/pipeline_runner.h"

namespace pipeforge::train {

std::map<std::string, CheckpointTensor> readCheckpointTensors(const std::string& step_dir, int num_stages,
                                                              bool parameters) {
  std::map<std::string, CheckpointTensor> out;
  for (int s = 0; s < num_stages; ++s) {
    StageCheckpoint state = readStageCheckpoint(step_dir, s);
    for (auto& [name, t] : parameters ? state.parameters : state.buffers) {
      auto it = out.find(name);
      if (it == out.end()) {
        out.emplace(name, CheckpointTensor{t, s});
        continue;
      }
      if (!it->second.tensor.sizes().equals(t.sizes()) || !it->second.tensor.equal(t)) {
        throw CheckpointError(fmt::format("'{}' differs between stage {} and stage {} of '{}'; the copies of a tied "
                                          "parameter must stay equal (a bug in the run that wrote it)",
                                          name, it->second.stage, s, step_dir));
      }
    }
  }
  return out;
}

void loadRunnerWeights(runtime::PipelineRunner& runner, const std::string& step_dir) {
  const CheckpointMeta meta = readCheckpointMeta(step_dir);
  const auto params = readCheckpointTensors(step_dir, meta.num_stages, /*parameters=*/true);
  const auto buffers = readCheckpointTensors(step_dir, meta.num_stages, /*parameters=*/false);
  c10::AutoGradMode no_grad(false);
  auto copy = [&](const char* kind, const runtime::NamedTensor& target,
                  const std::map<std::string, CheckpointTensor>& from) {
    auto it = from.find(target.name);
    if (it == from.end()) {
      throw CheckpointError(fmt::format("the model's {} '{}' (stage {}) is not in checkpoint '{}' (trained from '{}'); "
                                        "give the model the run was trained from",
                                        kind, target.name, target.stage, step_dir, meta.source));
    }
    at::Tensor value = it->second.tensor;
    if (const std::optional<int> dim = runner.tensorParallelDim(target.stage, target.name)) {
      // Tensor parallel: this rank's block of the whole tensor (Note [Tensor-parallel checkpoints]).
      const int64_t block = target.tensor.size(*dim);
      if (value.dim() > *dim && value.size(*dim) == block * runner.tensorParallel()) {
        value = value.narrow(*dim, runner.tpRank() * block, block);
      }
    }
    if (!target.tensor.sizes().equals(value.sizes()) || target.tensor.scalar_type() != value.scalar_type()) {
      throw CheckpointError(fmt::format("{} '{}': the model has {} {} but checkpoint '{}' {} {}; give the model the "
                                        "run was trained from ('{}')",
                                        kind, target.name, c10::toString(target.tensor.scalar_type()),
                                        c10::str(target.tensor.sizes()), step_dir, c10::toString(value.scalar_type()),
                                        c10::str(value.sizes()), meta.source));
    }
    at::Tensor t = target.tensor;
    t.copy_(value);
  };
  for (const auto& p : runner.parameters()) copy("parameter", p, params);
  for (const auto& b : runner.buffers()) copy("buffer", b, buffers);
}

}  // namespace pipeforge::train
