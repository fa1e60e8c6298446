// Fuzzes the pipe.json reader (stage/manifest.h): any text either parses or
// throws ManifestError; what parses writes back to JSON that parses equal.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_support.h"
#include "stage/manifest.h"

namespace {

using pipeforge::stage::ManifestError;
using pipeforge::stage::PipeManifest;
constexpr const char* kTarget = "manifest";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace pf = pipeforge;
  const std::string text = pf::fuzz::textOf(data, size);
  PipeManifest manifest;
  try {
    manifest = pf::stage::manifestFromJson(text, "fuzz/pipe.json");
  } catch (const ManifestError& e) {
    pf::fuzz::noteRejected(kTarget, e);
    return 0;
  } catch (...) {
    pf::fuzz::failOnUndocumentedException(kTarget, "manifestFromJson");
  }

  pf::fuzz::noteAccepted(kTarget);

  // Note: a manifest is a value with a JSON round trip (stage/manifest.h).
  std::string written;
  PipeManifest back;
  try {
    written = pf::stage::manifestToJson(manifest);
    back = pf::stage::manifestFromJson(written, "fuzz/round-trip.json");
  } catch (...) {
    pf::fuzz::failOnUndocumentedException(kTarget, "manifestToJson -> manifestFromJson round trip");
  }
  if (!(back == manifest)) {
    pf::fuzz::failProperty(kTarget, "the manifest does not survive manifestToJson/manifestFromJson:\n" + written);
  }
  return 0;
}
