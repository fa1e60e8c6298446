#include "train/gradient_check.h"

#include <algorithm>
#include <cmath>
#include <csignal>

namespace pipeforge::train {

GradientCheckFlags::GradientCheckFlags(int num_stages)
    : num_stages_(num_stages), values_(2 * static_cast<std::size_t>(num_stages) + 4, 0.0) {}

void GradientCheckFlags::addStageNorm2(int stage, double squared_norm) { values_.at(stage) += squared_norm; }

void GradientCheckFlags::addGlobalNorm2(double squared_norm) { values_[num_stages_ + 1] += squared_norm; }

void GradientCheckFlags::markLossNonFinite() { values_[num_stages_] = 1.0; }

void GradientCheckFlags::markInterrupted(int signal) {
  if (signal == SIGINT) values_[num_stages_ + 2] = 1.0;
  if (signal == SIGTERM) values_[num_stages_ + 3] = 1.0;
}

void GradientCheckFlags::markUpdateNonFinite(int stage) { values_.at(num_stages_ + 4 + stage) = 1.0; }

GradientCheck GradientCheckFlags::decode() const {
  const int n = num_stages_;
  const std::vector<double>& f = values_;
  GradientCheck out;
  for (int s = 0; s < n && out.bad.first_stage < 0; ++s) {
    if (!std::isfinite(f[s])) out.bad.first_stage = s;
  }
  out.bad.loss = f[n] > 0;
  out.norm = std::sqrt(f[n + 1]);
  // SIGTERM (a scheduler's) outranks SIGINT when ranks got different ones.
  out.interrupted_by = f[n + 3] > 0 ? SIGTERM : f[n + 2] > 0 ? SIGINT : 0;
  for (int s = 0; s < n && out.updated_nonfinite_stage < 0; ++s) {
    if (f[n + 4 + s] > 0) out.updated_nonfinite_stage = s;
  }
  return out;
}

TiedNames::TiedNames(const stage::PipeManifest& manifest) {
  for (const auto& group : manifest.tied) {
    for (const auto& name : group) canonical_[name] = group.front();
  }
  for (const auto& stage : manifest.stages) {
    for (const auto& name : stage.parameters) {
      auto [it, fresh] = first_holder_.emplace(canonical(name), stage.index);
      if (!fresh) it->second = std::min(it->second, stage.index);
    }
  }
}

const std::string& TiedNames::canonical(const std::string& name) const {
  auto it = canonical_.find(name);
  return it == canonical_.end() ? name : it->second;
}

}  // namespace pipeforge::train
