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
// The all-gather, posted: returns what waits for it (ZeRO stage 3's
// UNSHARD posts, the stage's next compute waits).
using PostAllGather = std::function<std::function<void()>(const at::Tensor& in, const at::Tensor& out)>;

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
  // parameters (an all-gather per bucket of one dtype: Note [Gather
  // buckets]). Nothing with the parameters sharded (stage 3).
  void gatherParameters();

  // ZeRO stage 3 (Note [Sharded parameters]), right after construction and
  // before pieces() is read; needs the reduce-scatter (stage 2). The pieces
  // move into buffers of their own and the whole parameters are released:
  // each keeps its shape's name and dtype but holds no elements until
  // unshard(). Throws std::invalid_argument without a reduce-scatter.
  void shardParameters(PostAllGather post_all_gather);
  bool shardsParameters() const { return static_cast<bool>(post_all_gather_); }
  // Stage 3: posts the all-gathers of every bucket (nothing when they are
  // posted or done already).
  void unshard();
  // Stage 3: waits for the posted gathers (posting them first when none
  // are) and gives every parameter its whole data; the autograd identity
  // of the parameters is unchanged.
  void waitUnsharded();
  // Stage 3: the whole data released (gathers still in flight waited
  // first); the pieces are what the optimizer steps.
  void reshard();
  // Stage 3, while unsharded: what was written into the whole parameters (a
  // checkpoint restored) becomes this rank's pieces.
  void keepParameters();
  bool unsharded() const { return unsharded_; }
  // Stage 3: bytes of whole parameters and gathers in flight held now.
  std::int64_t unshardedBytes() const;
  // Stage 3: this rank's parameter buffers (its pieces, padding included).
  std::vector<at::Tensor> parameterBuffers() const { return param_buffers_; }
  // Elements of the stage's parameters, each tensor once, whole.
  std::int64_t wholeElements() const;
  // Stage 3: this rank's piece of `name` (1-D, possibly empty), a view of
  // its buffer; and the parameter's whole shape. Throw std::out_of_range
  // for a name not in the stage.
  at::Tensor parameterPiece(const std::string& name) const;
  std::vector<std::int64_t> shape(const std::string& name) const;

 private:
  struct Group {  // a bucket: some of the stage's parameters of one dtype, in stage order
    std::vector<at::Tensor> tensors;
    std::vector<std::vector<std::int64_t>> shapes;  // each tensor's whole shape
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
  PostAllGather post_all_gather_;         // stage 3
  std::vector<at::Tensor> param_buffers_;  // stage 3: per bucket, this rank's pieces
  std::vector<at::Tensor> gathered_;       // stage 3, while unsharding: per bucket, every rank's pieces
  std::vector<std::function<void()>> pending_;  // stage 3: the posted gathers' waits
  bool unsharded_ = false;
  std::map<std::string, Entry> by_name_;
  std::vector<std::pair<std::string, at::Tensor>> pieces_;
  struct Piece {
    at::Tensor parameter;
    at::Tensor piece;
    ElementRange range;
    Entry entry;
  };
  std::vector<Piece> piece_of_;  // each distinct parameter with a piece here, once
};

// Stage 3 (Note [Sharded parameters]): the given stages' parameters whole
// for this object's life, for what reads or writes them outside a step (a
// checkpoint), then released. Stages that do not shard their parameters
// are left alone. Every replica makes one at the same point (all-gathers).
class WholeParameters {
 public:
  explicit WholeParameters(std::vector<ShardedStage*> stages);
  ~WholeParameters();
  WholeParameters(const WholeParameters&) = delete;
  WholeParameters& operator=(const WholeParameters&) = delete;
  // What was written into the whole parameters becomes this rank's pieces.
  void keep();

 private:
  std::vector<ShardedStage*> stages_;
};

}  // namespace pipeforge::sharding
