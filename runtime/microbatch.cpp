#include "runtime/microbatch.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

namespace pipeforge::runtime {

std::vector<std::vector<at::Tensor>> splitIntoMicrobatches(const std::vector<at::Tensor>& values,
                                                           const std::vector<ChunkSpec>& specs, int num_microbatches,
                                                           const std::string& what) {
  if (num_microbatches < 1) {
    throw RuntimeError(fmt::format("num_microbatches is {}; it must be at least 1", num_microbatches));
  }
  if (!specs.empty() && specs.size() != values.size()) {
    throw RuntimeError(fmt::format("{} chunk specs: {} given for {} {}s; give one per {} or none", what, specs.size(),
                                   values.size(), what, what));
  }
  std::vector<std::vector<at::Tensor>> out(num_microbatches, std::vector<at::Tensor>(values.size()));
  for (std::size_t k = 0; k < values.size(); ++k) {
    ChunkSpec spec = specs.empty() ? ChunkSpec::split(0) : specs[k];
    const at::Tensor& v = values[k];
    if (spec.replicate) {
      for (int mb = 0; mb < num_microbatches; ++mb) out[mb][k] = v;
      continue;
    }
    int64_t dims = v.dim();
    if (spec.dim < -dims || spec.dim >= dims) {
      throw RuntimeError(fmt::format("{} {} has shape {} with no dimension {} to split into microbatches; set its "
                                     "chunk spec to another dim or to replicated",
                                     what, k, fmt::join(v.sizes(), "x"), spec.dim));
    }
    int64_t size = v.size(spec.dim);
    if (size < num_microbatches) {
      throw RuntimeError(fmt::format("{} {} has {} rows along dim {}, fewer than the {} microbatches; use a larger "
                                     "batch or fewer microbatches",
                                     what, k, size, spec.dim, num_microbatches));
    }
    std::vector<at::Tensor> parts = at::tensor_split(v, num_microbatches, spec.dim);
    for (int mb = 0; mb < num_microbatches; ++mb) out[mb][k] = parts[mb];
  }
  return out;
}

std::vector<at::Tensor> mergeMicrobatches(const std::vector<std::vector<at::Tensor>>& per_microbatch, int dim) {
  if (per_microbatch.empty()) return {};
  std::vector<at::Tensor> merged;
  for (std::size_t k = 0; k < per_microbatch.front().size(); ++k) {
    std::vector<at::Tensor> parts;
    for (const auto& mb : per_microbatch) parts.push_back(mb.at(k));
    merged.push_back(parts.front().dim() == 0 ? at::stack(parts) : at::cat(parts, dim));
  }
  return merged;
}

}  // namespace pipeforge::runtime
