// ZeRO stage 1 for one pipeline stage on one rank (`pipeline.zero_stage: 1`):
// the optimizer steps only this rank's pieces of the stage's parameters
// (Note [Shards] in sharding/shard_layout.h), through views into the
// parameters themselves, and the data-parallel group then all-gathers the
// pieces each rank updated (Note [Sharded optimizer]).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "sharding/shard_layout.h"

namespace pipeforge::sharding {

// Fills `out` (group size x in.numel() elements, rank order) with every
// group member's `in`: the data-parallel all-gather.
using AllGather = std::function<void(const at::Tensor& in, const at::Tensor& out)>;

class ShardedStage {
 public:
  // `parameters`: the stage's parameters by name, a tensor listed under two
  // names (tied within the stage) once per name; `group_size` and `rank`:
  // the data-parallel group and this rank's place in it. Throws
  // std::invalid_argument for a parameter that is not contiguous.
  // Note [Gather buckets]: the all-gather runs per bucket of at most
  // `bucket_elements` in each rank's buffer (16 MB of float32 by default),
  // so that what it holds besides the parameters (this rank's buffer and the
  // gathered group x buffer) stays small whatever the stage's size; a
  // tensor larger than that is a bucket of its own.
  static constexpr std::int64_t kBucketElements = std::int64_t{4} << 20;
  ShardedStage(int stage, const std::vector<std::pair<std::string, at::Tensor>>& parameters, int group_size,
               int rank, AllGather all_gather, std::int64_t bucket_elements = kBucketElements);

  int stage() const { return stage_; }
  int groupSize() const { return group_size_; }
  int rank() const { return rank_; }

  // What the optimizer steps: each distinct parameter's piece, a 1-D view of
  // its elements own(name), under each of its names. Parameters whose piece
  // is empty on this rank are left out.
  const std::vector<std::pair<std::string, at::Tensor>>& pieces() const { return pieces_; }
  // The elements of `name`'s flattened parameter this rank owns, and its
  // element count; throws std::out_of_range for a name not in the stage.
  ElementRange own(const std::string& name) const;
  std::int64_t numel(const std::string& name) const;

  // Before the optimizer steps: each piece's gradient is the same elements
  // of its parameter's gradient (undefined where the parameter has none).
  void bindGradients();
  // After it stepped: every rank's updated pieces into every rank's
  // parameters (an all-gather per bucket of one dtype: Note [Gather buckets]).
  void gatherParameters();

 private:
  struct Group {  // a bucket: some of the stage's parameters of one dtype, in stage order
    std::vector<at::Tensor> tensors;
    ShardLayout layout;
  };
  struct Entry {
    std::size_t group = 0;
    std::size_t index = 0;  // within the group
  };

  int stage_;
  int group_size_;
  int rank_;
  AllGather all_gather_;
  std::vector<Group> groups_;
  std::map<std::string, Entry> by_name_;
  std::vector<std::pair<std::string, at::Tensor>> pieces_;
  struct Piece {
    at::Tensor parameter;
    at::Tensor piece;
    ElementRange range;
  };
  std::vector<Piece> piece_of_;  // each distinct parameter with a piece here, once
};

}  // namespace pipeforge::sharding
