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
// Sums `in` (group size x out.numel() elements) over the group and gives
// this rank its block in `out`: the data-parallel reduce-scatter.
using ReduceScatter = std::function<void(const at::Tensor& in, const at::Tensor& out)>;

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
  // With `reduce_scatter` (ZeRO stage 2, Note [Sharded gradients]) the
  // stage's gradients are reduced into this rank's pieces and the whole
  // ones released; without it (stage 1) every rank keeps them whole.
  ShardedStage(int stage, const std::vector<std::pair<std::string, at::Tensor>>& parameters, int group_size,
               int rank, AllGather all_gather, ReduceScatter reduce_scatter = nullptr,
               std::int64_t bucket_elements = kBucketElements);

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

  bool shardsGradients() const { return static_cast<bool>(reduce_scatter_); }

  // Stage 1, before the optimizer steps: each piece's gradient is the same
  // elements of its parameter's gradient (undefined where it has none).
  // Stage 2 binds them once, to the pieces reduceGradients fills.
  void bindGradients();
  // Stage 2, once the stage's backward of the step is done: its gradients
  // averaged over the group, this rank's pieces kept, the whole ones
  // released (one reduce-scatter per bucket).
  void reduceGradients();
  // Stage 2: the gradient piece this rank holds for `name` (undefined when
  // its piece is empty), and every bucket's pieces (padding included, zero).
  at::Tensor heldGradient(const std::string& name) const;
  std::vector<at::Tensor> gradientBuffers() const { return grad_buffers_; }
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
  ReduceScatter reduce_scatter_;
  std::vector<Group> groups_;
  std::vector<at::Tensor> grad_buffers_;  // stage 2: per bucket, this rank's reduced pieces
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
