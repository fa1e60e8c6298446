#include "train/model_state.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <set>

#include "runtime/pipeline_runner.h"
#include "train/optimizer_factory.h"
#include "train/optimizer_state.h"

namespace pipeforge::train {

namespace {

// Bytes of `t`'s storage, once per storage.
std::int64_t storageBytes(const at::Tensor& t, std::set<const void*>& seen) {
  if (!t.defined() || !t.has_storage()) return 0;
  const void* key = t.storage().data();
  if (key == nullptr || !seen.insert(key).second) return 0;
  return static_cast<std::int64_t>(t.storage().nbytes());
}

}  // namespace

ModelStateBytes measureModelState(int rank, const std::vector<runtime::NamedTensor>& parameters,
                                  const std::map<int, std::unique_ptr<torch::optim::Optimizer>>& optimizers,
                                  const std::map<int, std::vector<NamedParameter>>& stepped, OptimizerName name,
                                  const std::vector<at::Tensor>& held_gradients,
                                  const HeldParameters* held_parameters) {
  ModelStateBytes out;
  out.rank = rank;
  std::set<const void*> params, grads, states, counted;
  for (const auto& p : parameters) {
    if (held_parameters == nullptr) {
      if (counted.insert(p.tensor.unsafeGetTensorImpl()).second) out.parameters += p.tensor.numel();
      out.param_bytes += storageBytes(p.tensor, params);
    }
    if (held_gradients.empty()) out.grad_bytes += storageBytes(p.tensor.grad(), grads);
  }
  if (held_parameters != nullptr) {
    out.parameters = held_parameters->elements;
    for (const at::Tensor& t : held_parameters->tensors) out.param_bytes += storageBytes(t, params);
  }
  for (const at::Tensor& g : held_gradients) out.grad_bytes += storageBytes(g, grads);
  for (const auto& [stage, optimizer] : optimizers) {
    auto it = stepped.find(stage);
    if (it == stepped.end()) continue;
    const StageOptimizerState state = optimizerStateByName(*optimizer, name, it->second);
    for (const auto& [fqn, slots] : state.by_name) {
      for (const auto& [slot, tensor] : slots.slots) out.optimizer_bytes += storageBytes(tensor, states);
    }
  }
  return out;
}

ModelStateBytes estimateModelState(int rank, const std::vector<runtime::NamedTensor>& parameters, OptimizerName name,
                                   double momentum, int zero_stage, int replicas) {
  ModelStateBytes out;
  out.rank = rank;
  std::set<const void*> params, trained;
  int states = 0;
  switch (name) {
    case OptimizerName::kAdam:
    case OptimizerName::kAdamW: states = 2; break;
    case OptimizerName::kSgd: states = momentum != 0.0 ? 1 : 0; break;
  }
  const int shards = zero_stage >= 1 ? std::max(1, replicas) : 1;
  for (const auto& p : parameters) {
    if (!params.insert(p.tensor.unsafeGetTensorImpl()).second) continue;
    out.parameters += p.tensor.numel();
    const auto bytes = static_cast<std::int64_t>(p.tensor.nbytes());
    const std::int64_t piece =
        (p.tensor.numel() + shards - 1) / shards * static_cast<std::int64_t>(p.tensor.element_size());
    out.param_bytes += zero_stage >= 3 ? piece : bytes;
    if (!p.tensor.requires_grad()) continue;
    out.grad_bytes += zero_stage >= 2 ? piece : bytes;
    out.optimizer_bytes += states * piece;
  }
  return out;
}

nlohmann::json modelStateRecord(const ModelStateBytes& b) {
  return nlohmann::json{{"event", "model_state"},
                        {"rank", b.rank},
                        {"parameters", b.parameters},
                        {"param_bytes", b.param_bytes},
                        {"grad_bytes", b.grad_bytes},
                        {"optimizer_bytes", b.optimizer_bytes},
                        {"bytes_per_parameter",
                         b.parameters > 0 ? static_cast<double>(b.total()) / static_cast<double>(b.parameters) : 0.0}};
}

ModelStateBytes modelStateFromRecord(const nlohmann::json& j) {
  ModelStateBytes b;
  b.rank = j.at("rank").get<int>();
  b.parameters = j.at("parameters").get<std::int64_t>();
  b.param_bytes = j.at("param_bytes").get<std::int64_t>();
  b.grad_bytes = j.at("grad_bytes").get<std::int64_t>();
  b.optimizer_bytes = j.at("optimizer_bytes").get<std::int64_t>();
  return b;
}

std::string describeModelState(const ModelStateBytes& b) {
  auto mb = [](std::int64_t bytes) { return static_cast<double>(bytes) / 1e6; };
  return fmt::format("rank {}: {:.1f} MB parameters, {:.1f} MB gradients, {:.1f} MB optimizer state ({:.1f} bytes "
                     "per parameter)",
                     b.rank, mb(b.param_bytes), mb(b.grad_bytes), mb(b.optimizer_bytes),
                     b.parameters > 0 ? static_cast<double>(b.total()) / static_cast<double>(b.parameters) : 0.0);
}

}  // namespace pipeforge::train
