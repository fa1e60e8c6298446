#include "cli/schedule_memory.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <utility>

#include "cli/usage_error.h"
#include "common/byte_size.h"

namespace pipeforge::cli {

std::string MemoryUnit::format(double value) const {
  return bytes ? formatByteSize(value) : fmt::format("{:.4g}", value);
}

namespace {

// `text` as a plain number (bytes = false) or a size with a byte unit.
std::optional<std::pair<double, bool>> parseMemory(const std::string& text) {
  if (auto bytes = parseByteSize(text)) return std::make_pair(*bytes, true);
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(value)) return std::nullopt;
  return std::make_pair(value, false);
}

}  // namespace

MemoryOptions readMemoryOptions(const std::string& act_mem, const std::string& mem_limit, bool has_cost_file) {
  MemoryOptions m;
  if (has_cost_file) m.unit.name = "in the unit of --cost-file's activation_memory (default 1)";
  std::optional<std::pair<double, bool>> act, limit;
  if (!act_mem.empty()) {
    act = parseMemory(act_mem);
    if (!act || act->first <= 0) {
      throw UsageError(fmt::format("--act-mem {}: expected a positive number (1 = one microbatch's activations "
                                   "on one stage) or a size in bytes such as 512MiB",
                                   act_mem));
    }
    m.act_mem = act->first;
    m.unit.bytes = act->second;
    m.unit.name = fmt::format("in the unit of --act-mem (one microbatch on one stage = {})", act_mem);
  }
  if (!mem_limit.empty()) {
    limit = parseMemory(mem_limit);
    if (!limit || limit->first <= 0) {
      throw UsageError(fmt::format("--mem-limit {}: expected a positive number in the unit of --act-mem, or a "
                                   "size in bytes such as 8GiB with --act-mem in bytes too",
                                   mem_limit));
    }
    m.mem_limit = limit->first;
  }
  if (limit && limit->second && !(act && act->second)) {
    throw UsageError(fmt::format("--mem-limit {} is a size in bytes, so the simulator needs the activation memory "
                                 "in bytes too: add --act-mem with a byte unit, e.g. --act-mem 512MiB",
                                 mem_limit));
  }
  if (limit && !limit->second && act && act->second) {
    throw UsageError(fmt::format("--act-mem {} is in bytes, but --mem-limit {} has no unit: write it in bytes "
                                 "too, e.g. --mem-limit {}GiB",
                                 act_mem, mem_limit, mem_limit));
  }
  return m;
}

}  // namespace pipeforge::cli
