#include "runtime/microbatch.h"

#include <algorithm>

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

std::vector<std::int64_t> trimPadding(std::vector<std::vector<at::Tensor>>& inputs,
                                      std::vector<std::vector<at::Tensor>>& targets) {
  std::vector<std::int64_t> lengths;
  for (std::size_t mb = 0; mb < targets.size(); ++mb) {
    if (targets[mb].empty() || targets[mb][0].dim() < 2) {
      throw RuntimeError("trimming padding needs a first target of shape [batch, seq] (token rows)");
    }
    const at::Tensor& first = targets[mb][0];
    const std::int64_t full = first.size(1);
    // Columns holding any counted target; the last one ends the microbatch.
    const at::Tensor counted = at::ne(first, -1).any(0).nonzero();
    // At least 2 (torch.export's dynamic dimensions start at 2; one more
    // padded column changes nothing a causal model counts).
    const std::int64_t longest = counted.numel() == 0 ? 1 : counted.max().item<std::int64_t>() + 1;
    const std::int64_t length = std::min(full, std::max<std::int64_t>(longest, 2));
    for (auto* list : {&inputs[mb], &targets[mb]}) {
      for (std::size_t k = 0; k < list->size(); ++k) {
        at::Tensor& t = (*list)[k];
        if (t.dim() < 2) continue;
        if (t.size(1) != full) {
          throw RuntimeError(fmt::format("trimming padding: {} {} has length {} along dim 1 but the targets {}; "
                                         "variable sequence lengths need every [batch, seq] value of one length",
                                         list == &inputs[mb] ? "input" : "target", k, t.size(1), full));
        }
        if (length != full) t = t.narrow(1, 0, length).contiguous();
      }
    }
    lengths.push_back(length);
  }
  return lengths;
}

void padToLength(std::vector<std::vector<at::Tensor>>& per_microbatch, const std::vector<std::int64_t>& lengths,
                 std::int64_t full) {
  for (std::size_t mb = 0; mb < per_microbatch.size() && mb < lengths.size(); ++mb) {
    for (at::Tensor& t : per_microbatch[mb]) {
      if (t.dim() < 2 || t.size(1) != lengths[mb] || lengths[mb] == full) continue;
      std::vector<std::int64_t> sizes = t.sizes().vec();
      sizes[1] = full;
      at::Tensor padded = at::zeros(sizes, t.options());
      padded.narrow(1, 0, lengths[mb]).copy_(t);
      t = padded;
    }
  }
}

std::vector<at::Tensor> mergeMicrobatches(const std::vector<std::vector<at::Tensor>>& per_microbatch, int dim,
                                          const std::vector<ChunkSpec>& specs) {
  if (per_microbatch.empty()) return {};
  const std::size_t count = per_microbatch.front().size();
  if (!specs.empty() && specs.size() != count) {
    throw RuntimeError(fmt::format("pipeline.output_chunks gives {} entries but the model has {} outputs; give one "
                                   "per output, in order",
                                   specs.size(), count));
  }
  std::vector<at::Tensor> merged;
  for (std::size_t k = 0; k < count; ++k) {
    if (!specs.empty() && specs[k].replicate) {
      merged.push_back(per_microbatch.front().at(k));
      continue;
    }
    const int along = specs.empty() ? dim : specs[k].dim;
    std::vector<at::Tensor> parts;
    for (const auto& mb : per_microbatch) parts.push_back(mb.at(k));
    if (parts.front().dim() == 0) {
      merged.push_back(at::stack(parts));
      continue;
    }
    if (along >= parts.front().dim()) {
      throw RuntimeError(fmt::format("pipeline.output_chunks[{}]: output {} has {} dims (shape [{}]), no dim {} to "
                                     "join its microbatches along; give a dim below {} or replicate",
                                     k, k, parts.front().dim(), fmt::join(parts.front().sizes(), ","), along,
                                     parts.front().dim()));
    }
    merged.push_back(at::cat(parts, along));
  }
  return merged;
}

}  // namespace pipeforge::runtime
