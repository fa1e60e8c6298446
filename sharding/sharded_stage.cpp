#include "sharding/sharded_stage.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <stdexcept>

namespace pipeforge::sharding {

// Note [Sharded optimizer]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// ZeRO stage 1 as Megatron's distributed optimizer does it: gradients are
// averaged over the replicas as without sharding (every rank keeps the whole
// gradient), but each rank's optimizer holds state for its own piece of each
// parameter only and updates only that piece; an all-gather then gives every
// rank the whole updated parameter. The pieces are views of the parameters,
// so the update lands in place and the optimizer is LibTorch's (or
// MultiTensorAdam), unchanged: its state is piece-sized, 1/d of what it
// was. Adam, AdamW and SGD act element by element, so a piece steps exactly
// as the same elements of the whole parameter would (to the rounding of
// vectorised kernels at other alignments), and gradient clipping and the
// non-finite checks, which read the whole gradients before the step, are
// unchanged.

ShardedStage::ShardedStage(int stage, const std::vector<std::pair<std::string, at::Tensor>>& parameters,
                           int group_size, int rank, AllGather all_gather, ReduceScatter reduce_scatter,
                           std::int64_t bucket_elements)
    : stage_(stage),
      group_size_(group_size),
      rank_(rank),
      all_gather_(std::move(all_gather)),
      reduce_scatter_(std::move(reduce_scatter)) {
  std::map<at::ScalarType, std::size_t> open_bucket;  // per dtype: the bucket being filled
  std::map<const void*, Entry> seen;
  std::vector<std::vector<std::int64_t>> numels;
  std::vector<std::int64_t> filled;  // per bucket: its buffer's elements so far
  for (const auto& [name, t] : parameters) {
    auto it = seen.find(t.unsafeGetTensorImpl());
    if (it == seen.end()) {
      if (!t.is_contiguous()) {
        throw std::invalid_argument("parameter '" + name + "' of stage " + std::to_string(stage) +
                                    " is not contiguous, so it cannot be cut into pieces (pipeline.zero_stage)");
      }
      const std::int64_t chunk = chunkSize(t.numel(), group_size);
      auto g = open_bucket.find(t.scalar_type());
      if (g == open_bucket.end() || (filled[g->second] > 0 && filled[g->second] + chunk > bucket_elements)) {
        open_bucket[t.scalar_type()] = groups_.size();
        g = open_bucket.find(t.scalar_type());
        groups_.emplace_back();
        numels.emplace_back();
        filled.push_back(0);
      }
      Group& group = groups_[g->second];
      it = seen.emplace(t.unsafeGetTensorImpl(), Entry{g->second, group.tensors.size()}).first;
      group.tensors.push_back(t);
      group.shapes.push_back(t.sizes().vec());
      numels[g->second].push_back(t.numel());
      filled[g->second] += chunk;
    }
    by_name_.emplace(name, it->second);
  }
  for (std::size_t g = 0; g < groups_.size(); ++g) groups_[g].layout = ShardLayout(numels[g], group_size, rank);

  std::map<const void*, at::Tensor> piece_by_tensor;
  for (const auto& [name, t] : parameters) {
    const Entry& e = by_name_.at(name);
    const ElementRange r = groups_[e.group].layout.own(e.index);
    if (r.empty()) continue;
    auto it = piece_by_tensor.find(t.unsafeGetTensorImpl());
    if (it == piece_by_tensor.end()) {
      at::Tensor piece = t.detach().view({-1}).narrow(0, r.begin, r.size());
      it = piece_by_tensor.emplace(t.unsafeGetTensorImpl(), piece).first;
      piece_of_.push_back(Piece{t, piece, r, e});
    }
    pieces_.emplace_back(name, it->second);
  }
  if (shardsGradients()) {
    // Note [Sharded gradients]: each piece's gradient lives in its bucket's buffer.
    for (const Group& group : groups_) {
      grad_buffers_.push_back(at::zeros({group.layout.bufferSize()}, group.tensors.empty()
                                                                          ? at::TensorOptions(at::kFloat)
                                                                          : group.tensors.front().options()));
    }
    for (Piece& p : piece_of_) {
      if (!p.parameter.requires_grad()) continue;  // frozen: no gradient, as without sharding
      for (std::size_t g = 0; g < groups_.size(); ++g) {
        const auto& tensors = groups_[g].tensors;
        for (std::size_t i = 0; i < tensors.size(); ++i) {
          if (!tensors[i].is_same(p.parameter)) continue;
          p.piece.mutable_grad() = grad_buffers_[g].narrow(0, groups_[g].layout.offset(i), p.range.size());
        }
      }
    }
  }
}

// Note [Sharded gradients]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// ZeRO stage 2: a stage's gradients accumulate whole over the step's
// microbatches, as without sharding; once its last backward ran (its
// REDUCE_GRAD action, or the step's end), each bucket's gradients are laid
// out rank block by rank block (rank j's pieces at offset(i) of block j),
// reduce-scattered (summed) into this rank's buffer, divided by the group
// size (the replicas' average), and the whole gradients released. The
// pieces' gradients are views of those buffers, so the tied sums, the loss
// count division, unscaling, norms and clipping act on pieces, and every
// rank adds its pieces' squares to the global norm. Between steps a rank
// keeps 1/d of the gradients.
void ShardedStage::reduceGradients() {
  at::NoGradGuard no_grad;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const Group& group = groups_[g];
    const ShardLayout& layout = group.layout;
    if (layout.bufferSize() == 0) continue;
    at::Tensor send = at::zeros({layout.bufferSize() * group_size_}, grad_buffers_[g].options());
    for (std::size_t i = 0; i < group.tensors.size(); ++i) {
      const at::Tensor& grad = group.tensors[i].grad();
      if (!grad.defined()) continue;  // no gradient this step: zeros, as an all-reduce would give
      const at::Tensor flat = grad.reshape({-1});
      for (int k = 0; k < group_size_; ++k) {
        const ElementRange r = layout.piece(i, k);
        if (r.empty()) continue;
        send.narrow(0, layout.bufferSize() * k + layout.offset(i), r.size()).copy_(flat.narrow(0, r.begin, r.size()));
      }
    }
    for (const at::Tensor& t : group.tensors) t.mutable_grad() = at::Tensor();  // the whole one is not kept
    reduce_scatter_(send, grad_buffers_[g]);
    grad_buffers_[g].div_(group_size_);
  }
}

at::Tensor ShardedStage::heldGradient(const std::string& name) const {
  const Entry& e = by_name_.at(name);
  const ElementRange r = groups_[e.group].layout.own(e.index);
  if (r.empty() || grad_buffers_.empty()) return at::Tensor();
  return grad_buffers_[e.group].narrow(0, groups_[e.group].layout.offset(e.index), r.size());
}

ElementRange ShardedStage::own(const std::string& name) const {
  const Entry& e = by_name_.at(name);
  return groups_[e.group].layout.own(e.index);
}

std::int64_t ShardedStage::numel(const std::string& name) const {
  const Entry& e = by_name_.at(name);
  return groups_[e.group].layout.numel(e.index);
}

void ShardedStage::bindGradients() {
  if (shardsGradients()) return;  // bound once, to the reduced pieces
  for (Piece& p : piece_of_) {
    const at::Tensor& g = p.parameter.grad();
    p.piece.mutable_grad() = g.defined() ? g.reshape({-1}).narrow(0, p.range.begin, p.range.size()) : at::Tensor();
  }
}

void ShardedStage::gatherParameters() {
  if (shardsParameters()) return;  // gathered by the next UNSHARD
  at::NoGradGuard no_grad;
  for (Group& group : groups_) {
    const ShardLayout& layout = group.layout;
    if (group.tensors.empty() || layout.bufferSize() == 0) continue;
    const at::TensorOptions options = group.tensors.front().options();
    at::Tensor mine = at::zeros({layout.bufferSize()}, options);
    for (std::size_t i = 0; i < group.tensors.size(); ++i) {
      const ElementRange r = layout.own(i);
      if (r.empty()) continue;
      mine.narrow(0, layout.offset(i), r.size()).copy_(group.tensors[i].detach().view({-1}).narrow(0, r.begin, r.size()));
    }
    at::Tensor all = at::empty({layout.bufferSize() * group_size_}, options);
    all_gather_(mine, all);
    for (int k = 0; k < group_size_; ++k) {
      if (k == rank_) continue;
      const at::Tensor block = all.narrow(0, layout.bufferSize() * k, layout.bufferSize());
      for (std::size_t i = 0; i < group.tensors.size(); ++i) {
        const ElementRange r = layout.piece(i, k);
        if (r.empty()) continue;
        group.tensors[i].detach().view({-1}).narrow(0, r.begin, r.size()).copy_(block.narrow(0, layout.offset(i), r.size()));
      }
    }
  }
}

// Note [Sharded parameters]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// ZeRO stage 3, as FSDP runs it under PyTorch's pipeline schedules: between
// steps a rank holds only its pieces of each parameter, in one buffer per
// bucket (the all-gather's input as it is, no packing), and the optimizer
// steps views of those buffers. The whole parameters keep their identity
// (the stage's module, its autograd leaves and their .grad slots) but hold
// no elements: set_data gives each an empty tensor. UNSHARD posts the
// bucket's all-gather; the stage's next compute action waits for it and
// set_data gives each parameter a fresh whole tensor filled from every
// rank's block, so that what a forward saves for its backward is the
// parameter itself, whole again by the backward (RESHARD only comes after a
// stage's last compute in the window PyTorch's _add_unshard_reshard looks
// at: Note in schedules/add_unshard_reshard.cpp). RESHARD drops the whole
// data again. set_data keeps the version counter, so autograd does not see
// the swap as an in-place change. Gradients are stage 2's: reduce-scattered
// into this rank's pieces at REDUCE_GRAD, the whole ones released.
void ShardedStage::shardParameters(PostAllGather post_all_gather) {
  if (!shardsGradients()) {
    throw std::invalid_argument("sharding the parameters of stage " + std::to_string(stage_) +
                                " (pipeline.zero_stage 3) needs its gradients sharded too (a reduce-scatter)");
  }
  if (!post_all_gather) throw std::invalid_argument("shardParameters: no all-gather");
  at::NoGradGuard no_grad;
  param_buffers_.clear();
  for (const Group& group : groups_) {
    const at::TensorOptions options =
        group.tensors.empty() ? at::TensorOptions(at::kFloat) : group.tensors.front().options();
    at::Tensor buffer = at::zeros({group.layout.bufferSize()}, options);
    for (std::size_t i = 0; i < group.tensors.size(); ++i) {
      const ElementRange r = group.layout.own(i);
      if (r.empty()) continue;
      buffer.narrow(0, group.layout.offset(i), r.size())
          .copy_(group.tensors[i].detach().reshape({-1}).narrow(0, r.begin, r.size()));
    }
    param_buffers_.push_back(buffer);
  }
  // The pieces become views of the buffers; their gradients stay bound.
  std::map<const void*, at::Tensor> moved;
  for (Piece& p : piece_of_) {
    const Entry& e = p.entry;
    at::Tensor piece = param_buffers_[e.group].narrow(0, groups_[e.group].layout.offset(e.index), p.range.size());
    if (p.piece.grad().defined()) piece.mutable_grad() = p.piece.grad();
    moved.emplace(p.piece.unsafeGetTensorImpl(), piece);
    p.piece = piece;
  }
  for (auto& [name, piece] : pieces_) piece = moved.at(piece.unsafeGetTensorImpl());
  post_all_gather_ = std::move(post_all_gather);
  unsharded_ = true;
  reshard();
}

void ShardedStage::unshard() {
  if (!shardsParameters() || unsharded_ || !pending_.empty()) return;
  at::NoGradGuard no_grad;
  gathered_.assign(groups_.size(), at::Tensor());
  pending_.assign(groups_.size(), nullptr);
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    if (groups_[g].layout.bufferSize() == 0) continue;
    gathered_[g] = at::empty({groups_[g].layout.bufferSize() * group_size_}, param_buffers_[g].options());
    pending_[g] = post_all_gather_(param_buffers_[g], gathered_[g]);
  }
}

void ShardedStage::waitUnsharded() {
  if (!shardsParameters() || unsharded_) return;
  unshard();
  at::NoGradGuard no_grad;
  // Bucket by bucket: each gathered buffer is freed once its parameters
  // are filled, so the step holds one whole copy of the stage, not two. A
  // bucket's whole parameters are views of one allocation: a stage's worth
  // of small blocks made and freed every step would fragment the heap.
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    if (pending_[g]) pending_[g]();
    const Group& group = groups_[g];
    const ShardLayout& layout = group.layout;
    std::int64_t total = 0;
    for (std::size_t i = 0; i < group.tensors.size(); ++i) total += layout.numel(i);
    const at::Tensor flat =
        at::empty({total}, group.tensors.empty() ? param_buffers_[g].options() : group.tensors.front().options());
    std::int64_t offset = 0;
    for (std::size_t i = 0; i < group.tensors.size(); ++i) {
      at::Tensor t = group.tensors[i];
      at::Tensor whole = flat.narrow(0, offset, layout.numel(i));
      offset += layout.numel(i);
      for (int k = 0; k < group_size_; ++k) {
        const ElementRange r = layout.piece(i, k);
        if (r.empty()) continue;
        whole.narrow(0, r.begin, r.size())
            .copy_(gathered_[g].narrow(0, layout.bufferSize() * k + layout.offset(i), r.size()));
      }
      t.set_data(whole.view(group.shapes[i]));
    }
    gathered_[g] = at::Tensor();
  }
  pending_.clear();
  gathered_.clear();
  unsharded_ = true;
}

void ShardedStage::reshard() {
  if (!shardsParameters()) return;
  for (auto& wait : pending_) {
    if (wait) wait();  // a collective in flight is finished, not abandoned
  }
  pending_.clear();
  gathered_.clear();
  if (!unsharded_) return;
  at::NoGradGuard no_grad;
  for (const Group& group : groups_) {
    for (const at::Tensor& t : group.tensors) {
      at::Tensor released = t;
      released.set_data(at::empty({0}, t.options()));
    }
  }
  unsharded_ = false;
}

void ShardedStage::keepParameters() {
  if (!shardsParameters()) return;
  if (!unsharded_) throw std::logic_error("keepParameters: stage " + std::to_string(stage_) + " is not unsharded");
  at::NoGradGuard no_grad;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const Group& group = groups_[g];
    for (std::size_t i = 0; i < group.tensors.size(); ++i) {
      const ElementRange r = group.layout.own(i);
      if (r.empty()) continue;
      param_buffers_[g]
          .narrow(0, group.layout.offset(i), r.size())
          .copy_(group.tensors[i].detach().reshape({-1}).narrow(0, r.begin, r.size()));
    }
  }
}

std::int64_t ShardedStage::unshardedBytes() const {
  std::int64_t bytes = 0;
  for (const at::Tensor& t : gathered_) {
    if (t.defined()) bytes += static_cast<std::int64_t>(t.nbytes());
  }
  if (!unsharded_ || !shardsParameters()) return bytes;
  for (const Group& group : groups_) {
    for (const at::Tensor& t : group.tensors) bytes += static_cast<std::int64_t>(t.nbytes());
  }
  return bytes;
}

std::int64_t ShardedStage::wholeElements() const {
  std::int64_t n = 0;
  for (const Group& group : groups_) {
    for (std::size_t i = 0; i < group.layout.size(); ++i) n += group.layout.numel(i);
  }
  return n;
}

at::Tensor ShardedStage::parameterPiece(const std::string& name) const {
  const Entry& e = by_name_.at(name);
  const ShardLayout& layout = groups_[e.group].layout;
  return param_buffers_.at(e.group).narrow(0, layout.offset(e.index), layout.own(e.index).size());
}

std::vector<std::int64_t> ShardedStage::shape(const std::string& name) const {
  const Entry& e = by_name_.at(name);
  return groups_[e.group].shapes[e.index];
}

WholeParameters::WholeParameters(std::vector<ShardedStage*> stages) : stages_(std::move(stages)) {
  for (ShardedStage* s : stages_) s->unshard();  // every gather posted, then waited
  for (ShardedStage* s : stages_) s->waitUnsharded();
}

WholeParameters::~WholeParameters() {
  for (ShardedStage* s : stages_) {
    try {
      s->reshard();
    } catch (...) {
      // A failed gather already ended the run; its error is the one reported.
    }
  }
}

void WholeParameters::keep() {
  for (ShardedStage* s : stages_) s->keepParameters();
}

}  // namespace pipeforge::sharding
