#include "train/export_model.h"

#include <unistd.h>

#include <torch/script.h>

#include <filesystem>
#include <map>

#include <fmt/format.h>

#include "frontend/load_model.h"
#include "train/checkpoint.h"

namespace pipeforge::train {
namespace {

namespace fs = std::filesystem;

struct Found {
  at::Tensor tensor;
  int stage = 0;
};

// Name -> tensor over every stage; a name held by two stages (a tied
// parameter) must hold the same value in both.
std::map<std::string, Found> collect(const std::string& dir, int num_stages, bool parameters) {
  std::map<std::string, Found> out;
  for (int s = 0; s < num_stages; ++s) {
    StageCheckpoint state = readStageCheckpoint(dir, s);
    for (auto& [name, t] : parameters ? state.parameters : state.buffers) {
      auto it = out.find(name);
      if (it == out.end()) {
        out.emplace(name, Found{t, s});
        continue;
      }
      if (!it->second.tensor.sizes().equals(t.sizes()) || !it->second.tensor.equal(t)) {
        throw CheckpointError(fmt::format("'{}' differs between stage {} and stage {} of '{}'; the copies of a tied "
                                          "parameter must stay equal (a bug in the run that wrote it)",
                                          name, it->second.stage, s, dir));
      }
    }
  }
  return out;
}

void copyInto(const std::string& kind, const std::string& name, at::Tensor& target,
              const std::map<std::string, Found>& values, const std::string& dir) {
  auto it = values.find(name);
  if (it == values.end()) {
    throw CheckpointError(fmt::format("the model's {} '{}' is not in checkpoint '{}'; was it trained from this model?",
                                      kind, name, dir));
  }
  const at::Tensor& value = it->second.tensor;
  if (!target.sizes().equals(value.sizes()) || target.scalar_type() != value.scalar_type()) {
    throw CheckpointError(fmt::format("{} '{}': the model has {} {} but the checkpoint {} {}", kind, name,
                                      c10::toString(target.scalar_type()), c10::str(target.sizes()),
                                      c10::toString(value.scalar_type()), c10::str(value.sizes())));
  }
  target.copy_(value);
}

}  // namespace

ExportSummary exportTrainedModel(const ExportRequest& request) {
  std::error_code ec;
  if (fs::exists(request.out_path, ec) && !request.force) {
    throw CheckpointError(fmt::format("'{}' already exists; pass --force to replace it", request.out_path));
  }
  ExportSummary summary;
  summary.checkpoint_dir = resolveCheckpoint(request.checkpoint);
  verifyCheckpoint(summary.checkpoint_dir);
  CheckpointMeta meta = readCheckpointMeta(summary.checkpoint_dir);
  summary.step = meta.step;
  auto params = collect(summary.checkpoint_dir, meta.num_stages, true);
  auto buffers = collect(summary.checkpoint_dir, meta.num_stages, false);

  // Names of one tied group are one tensor in the model: their stage copies
  // must agree, or copying them in turn would keep whichever came last.
  for (const auto& group : meta.tied) {
    const Found* first = nullptr;
    for (const auto& name : group) {
      auto it = params.find(name);
      if (it == params.end()) continue;
      if (first == nullptr) {
        first = &it->second;
        continue;
      }
      if (!first->tensor.equal(it->second.tensor)) {
        throw CheckpointError(fmt::format("tied parameters '{}' (stage {}) and '{}' (stage {}) differ in '{}'; tied "
                                          "copies must stay equal (a bug in the run that wrote it)",
                                          group.front(), first->stage, name, it->second.stage,
                                          summary.checkpoint_dir));
      }
    }
    ++summary.tied_groups;
  }

  torch::jit::Module model = frontend::loadModel(request.model_path);
  std::map<std::string, bool> used;
  {
    torch::NoGradGuard no_grad;
    for (const auto& p : model.named_parameters(/*recurse=*/true)) {
      at::Tensor target = p.value;
      copyInto("parameter", p.name, target, params, summary.checkpoint_dir);
      used[p.name] = true;
      ++summary.parameters;
    }
    for (const auto& b : model.named_buffers(/*recurse=*/true)) {
      at::Tensor target = b.value;
      copyInto("buffer", b.name, target, buffers, summary.checkpoint_dir);
      used[b.name] = true;
      ++summary.buffers;
    }
  }
  for (const auto* values : {&params, &buffers}) {
    for (const auto& [name, found] : *values) {
      if (!used.count(name)) {
        throw CheckpointError(fmt::format("checkpoint '{}' holds '{}' (stage {}), which model '{}' lacks; export "
                                          "with the model the run was split from ({})",
                                          summary.checkpoint_dir, name, found.stage, request.model_path, meta.source));
      }
    }
  }

  const std::string temp = fmt::format("{}.tmp-{}", request.out_path, ::getpid());
  try {
    model.save(temp);
  } catch (const c10::Error& e) {
    fs::remove(temp, ec);
    throw CheckpointError(fmt::format("cannot write '{}': {}", request.out_path, e.what_without_backtrace()));
  }
  fs::rename(temp, request.out_path, ec);
  if (ec) {
    fs::remove(temp, ec);
    throw CheckpointError(fmt::format("cannot write '{}': {}", request.out_path, ec.message()));
  }
  return summary;
}

}  // namespace pipeforge::train
