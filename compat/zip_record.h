// Where a record of a PyTorch zip archive lies in its file, for mapping it
// instead of reading it (Note [Mapped weights] in frontend/pt2_archive.cpp).
// Include only where a PyTorchStreamReader is used.
#pragma once

#include <caffe2/serialize/inline_container.h>

#include <cstddef>
#include <optional>
#include <string>

#include "compat/torch_compat.h"

namespace pipeforge::compat {

struct RecordRange {
  std::size_t header = 0;  // the zip local header's offset
  std::size_t offset = 0;  // the record's first byte
  std::size_t size = 0;    // its length (uncompressed)
};

// The reader of LibTorch 1.x does not tell a record's size: nullopt there,
// and callers read the record instead.
inline std::optional<RecordRange> recordRange(caffe2::serialize::PyTorchStreamReader& reader, const std::string& name) {
#if PIPEFORGE_TORCH_AT_LEAST(2, 9)
  return RecordRange{reader.getRecordHeaderOffset(name), reader.getRecordOffset(name), reader.getRecordSize(name)};
#else
  (void)reader;
  (void)name;
  return std::nullopt;
#endif
}

}  // namespace pipeforge::compat
