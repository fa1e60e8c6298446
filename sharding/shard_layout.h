// How a data-parallel group divides a stage's tensors between its ranks
// (ZeRO, `pipeline.zero_stage`): plain arithmetic, torch-free.
//
// Note [Shards]
// ~~~~~~~~~~~~~
// Each tensor is flattened and cut into d chunks of ceil(n / d) elements;
// data-parallel rank k owns elements [k c, min((k + 1) c, n)) of it, so the
// last ranks' pieces may be shorter, or empty for a tensor of fewer than d
// elements. This is DeepSpeed's rule (each flattened parameter padded to a
// multiple of the group size); FSDP2 cuts rows instead, which needs no
// flattening but leaves ranks idle for a tensor of few rows. A piece is a
// contiguous run of the tensor's memory, so a rank updates its piece in place
// through a view, and a checkpoint names it by FQN and element range.
//
// For a collective, a rank packs its pieces of a stage's tensors one after
// another, each padded to its chunk size: every rank's buffer then has the
// same size, and rank j's piece of tensor i sits at offset(i) of rank j's
// block in an all-gather's output (and of a reduce-scatter's input).
#pragma once

#include <cstdint>
#include <vector>

namespace pipeforge::sharding {

// Elements [begin, end) of a flattened tensor.
struct ElementRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int64_t size() const { return end > begin ? end - begin : 0; }
  bool empty() const { return size() == 0; }
  friend bool operator==(const ElementRange& a, const ElementRange& b) {
    return a.begin == b.begin && a.end == b.end;
  }
};

// The elements both ranges hold (empty when they do not overlap).
ElementRange intersect(const ElementRange& a, const ElementRange& b);

// ceil(numel / group_size): every rank's padded piece of a tensor.
std::int64_t chunkSize(std::int64_t numel, int group_size);

// Rank `rank`'s piece of a tensor of `numel` elements (Note [Shards]).
ElementRange pieceOf(std::int64_t numel, int group_size, int rank);

// A stage's tensors as one rank of a group of `group_size` sees them.
class ShardLayout {
 public:
  ShardLayout() = default;
  // Throws std::invalid_argument for a group size below 1, a rank outside
  // it, or a negative element count.
  ShardLayout(std::vector<std::int64_t> numels, int group_size, int rank);

  int groupSize() const { return group_size_; }
  int rank() const { return rank_; }
  std::size_t size() const { return numels_.size(); }
  std::int64_t numel(std::size_t i) const { return numels_[i]; }
  std::int64_t chunk(std::size_t i) const { return chunks_[i]; }
  // Where tensor i's piece starts in each rank's buffer.
  std::int64_t offset(std::size_t i) const { return offsets_[i]; }
  // One rank's buffer: every tensor's chunk, padded (Note [Shards]).
  std::int64_t bufferSize() const { return buffer_size_; }
  // Rank `rank`'s piece of tensor i.
  ElementRange piece(std::size_t i, int rank) const;
  // This rank's piece of tensor i.
  ElementRange own(std::size_t i) const { return piece(i, rank_); }
  // Elements this rank owns over all tensors, padding not counted.
  std::int64_t ownedElements() const;

 private:
  std::vector<std::int64_t> numels_;
  std::vector<std::int64_t> chunks_;
  std::vector<std::int64_t> offsets_;
  std::int64_t buffer_size_ = 0;
  int group_size_ = 1;
  int rank_ = 0;
};

}  // namespace pipeforge::sharding
