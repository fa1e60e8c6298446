// Fuzzes the zip central-directory reader (common/torch_zip.h) that a split
// uses to copy records out of a user's .pt2: any bytes either read or throw
// ZipError, and every record read lies inside the input.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/torch_zip.h"
#include "fuzz/fuzz_support.h"

namespace {

constexpr const char* kTarget = "zip_directory";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace pf = pipeforge;
  std::vector<pf::ZipRecord> records;
  try {
    records = pf::readZipDirectory(data, size, "fuzz.pt2");
  } catch (const pf::ZipError& e) {
    pf::fuzz::noteRejected(kTarget, e);
    return 0;
  } catch (...) {
    pf::fuzz::failOnUndocumentedException(kTarget, "readZipDirectory");
  }
  pf::fuzz::noteAccepted(kTarget);
  for (const pf::ZipRecord& r : records) {
    if (r.data_offset > size || r.compressed_size > size - r.data_offset) {
      pf::fuzz::failProperty(kTarget, "a record reaches outside the input: " + r.name);
    }
    // Touch the first and last byte, so ASan checks the range.
    if (r.compressed_size > 0) {
      volatile std::uint8_t first = data[r.data_offset];
      volatile std::uint8_t last = data[r.data_offset + r.compressed_size - 1];
      (void)first;
      (void)last;
    }
  }
  return 0;
}
