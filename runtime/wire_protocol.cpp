#include "runtime/wire_protocol.h"

#include <fmt/format.h>

#include "common/error.h"
#include "runtime/errors.h"

namespace pipeforge::runtime {

std::uint32_t messageTag(int edge, int microbatch, int num_microbatches, MessageKind kind) {
  return static_cast<std::uint32_t>((static_cast<std::int64_t>(edge) * num_microbatches + microbatch) * 3 +
                                    static_cast<std::uint32_t>(kind));
}

std::vector<std::int64_t> encodeShapeMessage(const ShapeMessage& shape) {
  if (shape.sizes.size() > static_cast<std::size_t>(kMaxShapeMessageDims)) {
    throw RuntimeError(fmt::format("a {}-dimensional tensor crosses stages; at most {} dimensions are supported",
                                   shape.sizes.size(), kMaxShapeMessageDims));
  }
  std::vector<std::int64_t> words(kShapeMessageLen, 0);
  words[0] = shape.dtype;
  words[1] = static_cast<std::int64_t>(shape.sizes.size());
  for (std::size_t d = 0; d < shape.sizes.size(); ++d) words[2 + d] = shape.sizes[d];
  return words;
}

ShapeMessage decodeShapeMessage(const std::vector<std::int64_t>& words) {
  PIPEFORGE_CHECK(static_cast<std::int64_t>(words.size()) == kShapeMessageLen,
                  fmt::format("a shape message has {} words; it should have {}", words.size(), kShapeMessageLen));
  const std::int64_t ndim = words[1];
  PIPEFORGE_CHECK(words[0] >= 0, fmt::format("a shape message names dtype {}", words[0]));
  PIPEFORGE_CHECK(ndim >= 0 && ndim <= kMaxShapeMessageDims,
                  fmt::format("a shape message has {} dimensions; it should have 0 to {}", ndim, kMaxShapeMessageDims));
  ShapeMessage shape;
  shape.dtype = words[0];
  for (std::int64_t d = 0; d < ndim; ++d) {
    const std::int64_t size = words[2 + d];
    PIPEFORGE_CHECK(size >= 0, fmt::format("a shape message gives dimension {} size {}", d, size));
    shape.sizes.push_back(size);
  }
  for (std::int64_t w = 2 + ndim; w < kShapeMessageLen; ++w) {
    PIPEFORGE_CHECK(words[w] == 0, fmt::format("a shape message of {} dimensions has {} in word {}, after its sizes",
                                               ndim, words[w], w));
  }
  return shape;
}

std::string Transfer::name() const {
  return fmt::format("{} {}{}{}{} {} rank {}", recv ? "recv" : "send", stage, what, mb, shape ? " shape" : "",
                     recv ? "from" : "to", peer);
}

}  // namespace pipeforge::runtime
