// Fuzzes the safetensors reader (common/safetensors.h): any bytes either parse
// or throw SafetensorsError; what parses hands out only bytes of the input,
// and its tensors tile the data after the header exactly (Note [Untrusted
// headers]): no range reaches outside the input, none overlaps another.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/safetensors.h"
#include "fuzz/fuzz_support.h"

namespace {

using pipeforge::SafetensorsError;
using pipeforge::SafetensorsFile;
constexpr const char* kTarget = "safetensors";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace pf = pipeforge;
  std::shared_ptr<SafetensorsFile> file;
  try {
    file = SafetensorsFile::parse(data, size, "fuzz.safetensors");
  } catch (const SafetensorsError& e) {
    pf::fuzz::noteRejected(kTarget, e);
    return 0;
  } catch (...) {
    pf::fuzz::failOnUndocumentedException(kTarget, "SafetensorsFile::parse");
  }
  pf::fuzz::noteAccepted(kTarget);

  // The data starts after the 8-byte length and the header it gives.
  std::uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = (header << 8) | data[i];
  const std::uint8_t* at = data + 8 + header;
  const std::uint8_t* end = data + size;
  for (const pf::SafetensorsTensor& t : file->tensors()) {
    // In data order, back to back: each begins where the one before ended.
    if (t.data != at) {
      pf::fuzz::failProperty(kTarget, "tensor \"" + t.name + "\" does not begin where the one before it ends");
    }
    if (t.nbytes > static_cast<std::size_t>(end - t.data)) {
      pf::fuzz::failProperty(kTarget, "tensor \"" + t.name + "\" reaches past the input");
    }
    if (!pf::safetensorsDtypeBits(t.dtype)) {
      pf::fuzz::failProperty(kTarget, "tensor \"" + t.name + "\" has an unknown dtype \"" + t.dtype + "\"");
    }
    const std::uint64_t bits = static_cast<std::uint64_t>(*pf::safetensorsDtypeBits(t.dtype));
    if (static_cast<std::uint64_t>(t.numel()) * bits != static_cast<std::uint64_t>(t.nbytes) * 8) {
      pf::fuzz::failProperty(kTarget, "tensor \"" + t.name + "\": numel x bits is not 8 x nbytes");
    }
    if (file->find(t.name) != &t) pf::fuzz::failProperty(kTarget, "find(\"" + t.name + "\") misses its tensor");
    at = t.data + t.nbytes;
  }
  if (at != end) pf::fuzz::failProperty(kTarget, "the tensors do not end at the end of the input");
  return 0;
}
