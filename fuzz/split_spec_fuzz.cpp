// Fuzzes the split-spec YAML reader (partitioner/split_spec.h): any text
// either parses into a spec that keeps the documented invariants or throws
// SpecError. yaml-cpp's own exceptions must not escape.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_support.h"
#include "partitioner/split_spec.h"

namespace {

namespace pf = pipeforge;
using pf::partitioner::Policy;
using pf::partitioner::SpecError;
using pf::partitioner::SplitSpec;
constexpr const char* kTarget = "split_spec";

void checkInvariants(const SplitSpec& spec) {
  if (spec.num_stages && *spec.num_stages < 1) pf::fuzz::failProperty(kTarget, "num_stages < 1 was accepted");
  if (spec.policy != Policy::kNone && !spec.num_stages) pf::fuzz::failProperty(kTarget, "a policy without num_stages was accepted");
  for (const auto& in : spec.example_inputs) {
    for (auto size : in.shape) {
      if (size < 0) pf::fuzz::failProperty(kTarget, "a negative example_inputs size was accepted");
    }
  }
  for (const auto& c : spec.constant_inputs) {
    // stage/constant_inputs.cpp reads items[0] of a scalar.
    if (c.kind == pf::partitioner::ConstantInput::Kind::kScalar && c.items.size() != 1) {
      pf::fuzz::failProperty(kTarget, "constant_inputs." + c.name + " is a scalar without exactly one text");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text = pf::fuzz::textOf(data, size);
  SplitSpec spec;
  try {
    spec = pf::partitioner::parseSplitSpec(text, "fuzz/split.yaml");
  } catch (const SpecError& e) {
    pf::fuzz::noteRejected(kTarget, e);
    return 0;
  } catch (...) {
    pf::fuzz::failOnUndocumentedException(kTarget, "parseSplitSpec");
  }
  pf::fuzz::noteAccepted(kTarget);
  checkInvariants(spec);
  return 0;
}
