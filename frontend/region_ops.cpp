#include "frontend/region_ops.h"

#include <torch/library.h>

#include <stdexcept>

#include "compat/autocast.h"

namespace {

// The state list autocast_enter returns: [enabled, dtype, cache_enabled].
std::vector<int64_t> encode(const pipeforge::compat::AutocastState& s) {
  return {s.enabled ? 1 : 0, s.dtype, s.cache_enabled ? 1 : 0};
}

pipeforge::compat::AutocastState decode(const std::vector<int64_t>& v) {
  if (v.size() != 3) throw std::invalid_argument("pipeforge::autocast_exit: the state is not autocast_enter's");
  return {v[0] != 0, static_cast<int>(v[1]), v[2] != 0};
}

// c10::optional, not std::optional: LibTorch 1.13's registration maps only
// c10::optional to a schema's `T?` (in 2.x the two are one type).
std::vector<int64_t> autocastEnter(std::string device_type, c10::optional<at::ScalarType> dtype, bool enabled,
                                   c10::optional<bool> cache_enabled) {
  std::optional<int> code;
  if (dtype) code = static_cast<int>(*dtype);
  std::optional<bool> cache;
  if (cache_enabled) cache = *cache_enabled;
  return encode(pipeforge::compat::enterAutocastRegion(device_type, code, enabled, cache));
}

void autocastExit(std::string device_type, std::vector<int64_t> state) {
  pipeforge::compat::exitAutocastRegion(device_type, decode(state));
}

TORCH_LIBRARY_FRAGMENT(pipeforge, m) {
  m.def(torch::schema("autocast_enter(str device_type, ScalarType? dtype, bool enabled, bool? cache_enabled) -> int[]",
                      c10::AliasAnalysisKind::CONSERVATIVE),
        autocastEnter);
  m.def(torch::schema("autocast_exit(str device_type, int[] state) -> ()", c10::AliasAnalysisKind::CONSERVATIVE),
        autocastExit);
}

}  // namespace

namespace pipeforge::frontend {

void ensureRegionOpsRegistered() {}

}  // namespace pipeforge::frontend
