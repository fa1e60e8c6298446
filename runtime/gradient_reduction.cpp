#include "runtime/gradient_reduction.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "runtime/comm.h"
#include "runtime/stage_sharding.h"
#include "runtime/step_trace.h"

namespace pipeforge::runtime {
namespace {

// The gradient of `p`, zeros when it got none (every replica and holder
// must contribute a tensor of the same shape to a sum).
at::Tensor& definedGrad(at::Tensor& p) {
  if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
  return p.mutable_grad();
}

}  // namespace

GradientReducer::GradientReducer(Communicator& comm, GradientReductionConfig config, ParametersOf parameters_of)
    : comm_(comm), cfg_(std::move(config)), parameters_of_(std::move(parameters_of)) {}

void GradientReducer::beginStep() { reduced_.clear(); }

// One all-reduce per stage: the gradients flattened into one tensor, summed,
// divided by the number of replicas and copied back.
void GradientReducer::reduceStage(int stage, StepTrace& trace) {
  if (cfg_.dp_degree <= 1 || reduced_.count(stage)) return;
  const auto t0 = StepClock::now();
  if (sharding_ != nullptr) {
    reduced_.insert(stage);
    sharding_->reduceGradients(stage);
    if (trace.profiling()) {
      trace.record(SpanKind::kAllReduce,
                   fmt::format("reduce-scatter grads stage {} over {} replicas", stage, cfg_.dp_degree), t0,
                   StepClock::now());
    }
    return;
  }
  std::vector<at::Tensor> grads;
  for (auto& [name, p] : parameters_of_(stage)) {
    if (p.requires_grad()) grads.push_back(definedGrad(p));
  }
  reduced_.insert(stage);
  if (grads.empty()) return;
  std::vector<at::Tensor> flat_parts;
  for (const at::Tensor& g : grads) flat_parts.push_back(g.reshape({-1}));
  at::Tensor flat = at::cat(flat_parts);
  comm_.allreduceSum(flat, cfg_.dp_group);
  flat.div_(cfg_.dp_degree);
  int64_t offset = 0;
  for (at::Tensor& g : grads) {
    g.copy_(flat.narrow(0, offset, g.numel()).view_as(g));
    offset += g.numel();
  }
  if (trace.profiling()) {
    trace.record(SpanKind::kAllReduce, fmt::format("all-reduce grads stage {} over {} replicas", stage, cfg_.dp_degree),
                 t0, StepClock::now());
  }
}

void GradientReducer::sumTied(StepTrace& trace) {
  for (const TiedGroup& tied : cfg_.tied) {
    if (!tied.crosses_stages || tied.local.empty()) continue;
    const auto t0 = StepClock::now();
    at::Tensor sum;
    std::vector<at::Tensor> grads;  // what each holder keeps: its gradient, or its piece of it
    for (const auto& [s, fqn] : tied.local) {
      for (auto& [name, p] : parameters_of_(s)) {
        if (name != fqn) continue;
        at::Tensor g = sharding_ != nullptr ? sharding_->heldGradient(s, fqn) : definedGrad(p);
        if (!g.defined()) continue;  // no piece of it on this rank, nor on the tied holders of this replica
        sum = sum.defined() ? sum + g : g.clone();
        grads.push_back(g);
      }
    }
    if (!sum.defined()) continue;
    if (tied.ranks.size() > 1) comm_.allreduceSum(sum, tied.ranks);
    for (at::Tensor& g : grads) g.copy_(sum);
    if (trace.profiling() && tied.ranks.size() > 1) {
      trace.record(SpanKind::kAllReduce, fmt::format("all-reduce tied grads {}", tied.local.front().second), t0,
                   StepClock::now());
    }
  }
}

}  // namespace pipeforge::runtime
