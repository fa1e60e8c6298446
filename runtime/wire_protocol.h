// The executor's wire protocol: how each message of a step is tagged, how a
// forward value's shape is described to its receiver, and how the trace
// names a message. Torch-free: a shape is a list of integers and a dtype the
// number of its at::ScalarType.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pipeforge::runtime {

// What a message on an edge of the communication plan carries.
enum class MessageKind : std::uint32_t {
  kValue = 0,  // a forward value
  kGrad = 1,   // the gradient of a forward value, sent back
  kMeta = 2,   // the shape message of a forward value (Note [Shape inference])
};

// Note [Message tags]
// ~~~~~~~~~~~~~~~~~~~
// Every message of a step has a tag of its own, so a receive matches its
// send whatever order the two ranks post them in:
//   tag = (edge * num_microbatches + microbatch) * 3 + kind
// e.g. with 4 microbatches, the gradient (kind 1) of edge 2, microbatch 3 is
// (2 * 4 + 3) * 3 + 1 = 34. Tags restart every step.
std::uint32_t messageTag(int edge, int microbatch, int num_microbatches, MessageKind kind);

// Note [Shape messages]
// ~~~~~~~~~~~~~~~~~~~~~
// The description of a forward value, sent ahead of it when the receiver
// cannot know its shape (Note [Shape inference]), is a fixed-length int64
// tensor, so its own receive can be posted without one:
//   [dtype, ndim, size_0 .. size_{ndim-1}, 0 ...]   (kShapeMessageLen words)
// e.g. a float32 (dtype 6) [8, 16] value: [6, 2, 8, 16, 0, 0, 0, 0, 0, 0, 0, 0].
constexpr std::int64_t kMaxShapeMessageDims = 10;
constexpr std::int64_t kShapeMessageLen = 2 + kMaxShapeMessageDims;

struct ShapeMessage {
  std::vector<std::int64_t> sizes;
  std::int64_t dtype = 0;  // the value of its at::ScalarType

  bool operator==(const ShapeMessage& other) const { return sizes == other.sizes && dtype == other.dtype; }
};

// The words of `shape`'s message. Throws RuntimeError when it has more than
// kMaxShapeMessageDims dimensions.
std::vector<std::int64_t> encodeShapeMessage(const ShapeMessage& shape);
// The shape a message describes. A message no encodeShapeMessage made (a
// wrong length, a dimension count or size out of range, words after the
// sizes) is a broken invariant: Error{kInternal} saying what is wrong.
ShapeMessage decodeShapeMessage(const std::vector<std::int64_t>& words);

// A message as the trace names it (Note [Trace slice kinds]): the action that
// consumes a receive or produced a send, and the peer, as "recv 1F3 from rank 0",
// "send 0B3 to rank 1" or "recv 1F3 shape from rank 0".
struct Transfer {
  bool recv = true;
  int stage = 0;
  char what = 'F';  // F: a forward value, B: a gradient
  int mb = 0;
  int peer = 0;
  bool shape = false;  // the value's shape message (Note [Shape messages])

  std::string name() const;
};

}  // namespace pipeforge::runtime
