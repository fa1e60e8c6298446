#include "sharding/shard_layout.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace pipeforge::sharding {

ElementRange intersect(const ElementRange& a, const ElementRange& b) {
  const std::int64_t begin = std::max(a.begin, b.begin);
  const std::int64_t end = std::min(a.end, b.end);
  return end > begin ? ElementRange{begin, end} : ElementRange{begin, begin};
}

std::int64_t chunkSize(std::int64_t numel, int group_size) {
  if (group_size < 1) throw std::invalid_argument("a shard group needs at least one rank");
  if (numel < 0) throw std::invalid_argument("a tensor cannot have a negative element count");
  return (numel + group_size - 1) / group_size;
}

ElementRange pieceOf(std::int64_t numel, int group_size, int rank) {
  if (rank < 0 || rank >= group_size) {
    throw std::invalid_argument("rank " + std::to_string(rank) + " is outside a group of " + std::to_string(group_size));
  }
  const std::int64_t c = chunkSize(numel, group_size);
  const std::int64_t begin = std::min(numel, c * rank);
  return ElementRange{begin, std::min(numel, begin + c)};
}

ShardLayout::ShardLayout(std::vector<std::int64_t> numels, int group_size, int rank)
    : numels_(std::move(numels)), group_size_(group_size), rank_(rank) {
  pieceOf(0, group_size, rank);  // checks the group and the rank
  for (std::int64_t n : numels_) {
    chunks_.push_back(chunkSize(n, group_size));
    offsets_.push_back(buffer_size_);
    buffer_size_ += chunks_.back();
  }
}

ElementRange ShardLayout::piece(std::size_t i, int rank) const { return pieceOf(numels_[i], group_size_, rank); }

std::int64_t ShardLayout::ownedElements() const {
  std::int64_t n = 0;
  for (std::size_t i = 0; i < numels_.size(); ++i) n += own(i).size();
  return n;
}

}  // namespace pipeforge::sharding
