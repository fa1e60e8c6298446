#include "tensor_parallel/tp_ops.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <mutex>
#include <vector>
#include <string>
#include <unordered_map>

#include "common/error.h"

namespace pipeforge::tensor_parallel {
namespace {

// Note [Tensor-parallel collectives]: a layer split by columns then rows
// (Megatron's pattern) runs on every rank of the group with the same
// replicated input x. Each rank computes its columns, and its part of the
// row-split product; `reduce` (g) sums the parts, so every rank leaves the
// layer with the whole output. Backward mirrors it: g passes the gradient
// through, each rank's columns give only their share of dL/dx, and `copy`
// (f) sums the shares where x entered. Every replicated value that meets a
// split one gets an f, not only a column linear's input: a norm weight
// applied per head, say, has a gradient each rank computes from its heads
// only. Only a value that requires grad pays: without one the op records no
// backward.
struct Groups {
  std::mutex mutex;
  std::unordered_map<int, AllReduce> all_reduce;
  int next = 1;
};

Groups& groups() {
  static Groups g;
  return g;
}

AllReduce lookup(int64_t group) {
  Groups& g = groups();
  std::lock_guard<std::mutex> lock(g.mutex);
  auto it = g.all_reduce.find(static_cast<int>(group));
  if (it == g.all_reduce.end()) {
    throw Error(ErrorCode::kInternal,
                "tensor-parallel group " + std::to_string(group) +
                    " is not registered: a rewritten stage ran outside the run that rewrote it");
  }
  return it->second;
}

at::Tensor summed(const at::Tensor& x, int64_t group) {
  at::Tensor out = x.contiguous().clone();
  lookup(group)(out);
  return out;
}

struct CopyToGroup : public torch::autograd::Function<CopyToGroup> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {summed(grads[0], ctx->saved_data["group"].toInt()), at::Tensor()};
  }
};

struct ReduceOverGroup : public torch::autograd::Function<ReduceOverGroup> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x, int64_t group) {
    return summed(x, group);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

// All-gather through the group's all-reduce: each rank's block in place in
// zeros, summed (exact: every element has one non-zero term).
at::Tensor allGather(const at::Tensor& x, int64_t d, int64_t rank, int64_t degree, int64_t group) {
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes[d] *= degree;
  at::Tensor whole = at::zeros(sizes, x.options());
  whole.narrow(d, rank * x.size(d), x.size(d)).copy_(x);
  lookup(group)(whole);
  return whole;
}

// The stage output's gather: its gradient arrives whole on every rank, so
// backward keeps this rank's block.
struct GatherFromGroup : public torch::autograd::Function<GatherFromGroup> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t dim, int64_t rank,
                            int64_t degree, int64_t group) {
    const int64_t d = dim < 0 ? dim + x.dim() : dim;
    ctx->saved_data["dim"] = d;
    ctx->saved_data["rank"] = rank;
    ctx->saved_data["block"] = x.size(d);
    return allGather(x, d, rank, degree, group);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const int64_t d = ctx->saved_data["dim"].toInt();
    const int64_t block = ctx->saved_data["block"].toInt();
    return {grads[0].narrow(d, ctx->saved_data["rank"].toInt() * block, block), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

// This rank's block along `dim` of the sum over the group.
at::Tensor reduceScatter(const at::Tensor& x, int64_t d, int64_t rank, int64_t degree, int64_t group) {
  if (x.size(d) % degree != 0) {
    // A remainder would fall between the blocks: refuse rather than drop it.
    throw Error(ErrorCode::kUserInput,
                "sequence parallel splits the sequence over " + std::to_string(degree) +
                    " tensor-parallel ranks, and this batch's sequence has " + std::to_string(x.size(d)) +
                    " positions; feed sequence lengths tensor_parallel divides (data.block_size), or set "
                    "pipeline.sequence_parallel: false");
  }
  const int64_t block = x.size(d) / degree;
  return summed(x, group).narrow(d, rank * block, block).contiguous();
}

struct SequenceGather : public torch::autograd::Function<SequenceGather> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t dim, int64_t rank,
                            int64_t degree, int64_t group) {
    const int64_t d = dim < 0 ? dim + x.dim() : dim;
    ctx->saved_data["args"] = std::vector<int64_t>{d, rank, degree, group};
    return allGather(x, d, rank, degree, group);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const std::vector<int64_t> a = ctx->saved_data["args"].toIntVector();
    return {reduceScatter(grads[0], a[0], a[1], a[2], a[3]), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct SequenceScatter : public torch::autograd::Function<SequenceScatter> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t dim, int64_t rank,
                            int64_t degree, int64_t group) {
    const int64_t d = dim < 0 ? dim + x.dim() : dim;
    ctx->saved_data["args"] = std::vector<int64_t>{d, rank, degree, group};
    return reduceScatter(x, d, rank, degree, group);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const std::vector<int64_t> a = ctx->saved_data["args"].toIntVector();
    return {allGather(grads[0].contiguous(), a[0], a[1], a[2], a[3]), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

at::Tensor sequenceGatherOp(const at::Tensor& x, int64_t dim, int64_t rank, int64_t degree, int64_t group) {
  return SequenceGather::apply(x, dim, rank, degree, group);
}
at::Tensor sequenceScatterOp(const at::Tensor& x, int64_t dim, int64_t rank, int64_t degree, int64_t group) {
  return SequenceScatter::apply(x, dim, rank, degree, group);
}

// Note [Vocab-parallel embedding] in tp_plan.cpp.
struct VocabEmbedding : public torch::autograd::Function<VocabEmbedding> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& weight, const at::Tensor& ids,
                            int64_t start, int64_t padding_idx, int64_t group) {
    const int64_t rows = weight.size(0);
    at::Tensor local = ids.sub(start);
    const at::Tensor outside = at::logical_or(local.lt(0), local.ge(rows));
    local = local.masked_fill(outside, 0);
    at::Tensor out = at::embedding(weight.detach(), local).masked_fill(outside.unsqueeze(-1), 0);
    lookup(group)(out);
    // The rows whose lookups carry a gradient: this rank's, but padding_idx's.
    at::Tensor counted = at::logical_not(outside);
    if (padding_idx >= 0) counted = at::logical_and(counted, ids.ne(padding_idx));
    ctx->save_for_backward({local, counted});
    ctx->saved_data["rows"] = rows;
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& local = saved[0];
    const at::Tensor& counted = saved[1];
    const at::Tensor grad = grads[0].reshape({-1, grads[0].size(-1)});
    const at::Tensor keep = counted.reshape({-1});
    at::Tensor grad_weight = at::zeros({ctx->saved_data["rows"].toInt(), grad.size(1)}, grad.options());
    const at::Tensor rows = keep.nonzero().squeeze(1);
    grad_weight.index_add_(0, local.reshape({-1}).index_select(0, rows), grad.index_select(0, rows));
    return {grad_weight, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor vocabEmbeddingOp(const at::Tensor& weight, const at::Tensor& ids, int64_t start, int64_t padding_idx,
                            int64_t group) {
  return VocabEmbedding::apply(weight, ids, start, padding_idx, group);
}

// Note [Vocab-parallel cross-entropy]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Megatron's loss parallel: with lm_head split by columns, each rank holds
// the logits of its block of the vocabulary, and gathering [N, V] to take
// the loss would cost what splitting lm_head saved. Row i's loss is
// log Σ_v exp(x_iv − m_i) − (x_i,target − m_i), with m_i the row's largest
// logit over the whole vocabulary for stability. Each rank writes its own
// row maxima into its row of [degree, N] zeros, and one all-reduce gives
// every rank all of them (the group's all-reduce is its only collective).
// A second all-reduce of [3, N] sums Σ exp over each block, the target's
// logit (from the rank whose block holds it, zero elsewhere), and how many
// ranks hold each target: exactly one for a target inside the vocabulary,
// which is how an out-of-range target is caught (at::cross_entropy_loss
// refuses it too). Backward needs no collective: this rank's block of
// softmax(x) − onehot(target), both known locally.
struct VocabCrossEntropy : public torch::autograd::Function<VocabCrossEntropy> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& target,
                            int64_t rank, int64_t degree, int64_t group, bool sum, int64_t ignore_index) {
    const at::Tensor x = logits.to(at::kFloat);
    const int64_t rows = x.size(0), block = x.size(1);
    at::Tensor maxima = at::zeros({degree, rows}, x.options());
    if (rows > 0) maxima.select(0, rank).copy_(std::get<0>(x.max(1)));
    lookup(group)(maxima);
    const at::Tensor z = x - std::get<0>(maxima.max(0)).unsqueeze(1);
    const at::Tensor e = z.exp();
    const at::Tensor counted = target.ne(ignore_index);
    const at::Tensor local = target - rank * block;
    const at::Tensor mine = at::logical_and(at::logical_and(local.ge(0), local.lt(block)), counted);
    const at::Tensor index = local.masked_fill(at::logical_not(mine), 0).unsqueeze(1);
    const at::Tensor picked = z.gather(1, index).squeeze(1).masked_fill(at::logical_not(mine), 0);
    at::Tensor sums = at::stack({e.sum(1), picked, mine.to(at::kFloat)});
    lookup(group)(sums);
    const at::Tensor misplaced = sums.select(0, 2).ne(counted.to(at::kFloat)).any();
    if (x.is_cpu()) {
      if (misplaced.item<bool>()) {
        const at::Tensor bad = target.masked_select(sums.select(0, 2).ne(counted.to(at::kFloat)));
        throw Error(ErrorCode::kUserInput,
                    "cross-entropy: target " + std::to_string(bad[0].item<int64_t>()) +
                        " is outside the vocabulary [0, " + std::to_string(degree * block) +
                        ") of the logits (split over " + std::to_string(degree) +
                        " tensor-parallel ranks); targets are class indices below the vocabulary size, or " +
                        std::to_string(ignore_index) + " for a position the loss skips");
      }
    } else {
      at::_assert_async(at::logical_not(misplaced));  // no host sync on a GPU
    }
    const at::Tensor per_row = (sums.select(0, 0).log() - sums.select(0, 1)).masked_fill(at::logical_not(counted), 0);
    const at::Tensor count = counted.sum().to(at::kFloat);
    ctx->save_for_backward({e / sums.select(0, 0).unsqueeze(1), index, mine, counted, sum ? at::ones({}) : count});
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return sum ? per_row.sum() : per_row.sum() / count;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    at::Tensor grad = saved[0].clone();
    grad.scatter_add_(1, saved[1], -saved[2].to(grad.scalar_type()).unsqueeze(1));
    grad.mul_(saved[3].unsqueeze(1).to(grad.scalar_type()));
    grad.mul_(grads[0] / saved[4]);
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grad.to(dtype), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor gatherOp(const at::Tensor& x, int64_t dim, int64_t rank, int64_t degree, int64_t group) {
  return GatherFromGroup::apply(x, dim, rank, degree, group);
}

at::Tensor copyOp(const at::Tensor& x, int64_t group) { return CopyToGroup::apply(x, group); }
at::Tensor reduceOp(const at::Tensor& x, int64_t group) { return ReduceOverGroup::apply(x, group); }

// A catch-all kernel is CompositeImplicitAutograd: it runs above autograd,
// so the custom Functions record their own backward nodes. CONSERVATIVE
// alias analysis: the ops talk to other processes, so the JIT must neither
// reorder them nor drop one whose output looks unused.
TORCH_LIBRARY(pipeforge_tp, m) {
  m.def(torch::schema("copy(Tensor x, int group) -> Tensor", c10::AliasAnalysisKind::CONSERVATIVE), &copyOp);
  m.def(torch::schema("reduce(Tensor x, int group) -> Tensor", c10::AliasAnalysisKind::CONSERVATIVE), &reduceOp);
  m.def(torch::schema("gather(Tensor x, int dim, int rank, int degree, int group) -> Tensor",
                      c10::AliasAnalysisKind::CONSERVATIVE),
        &gatherOp);
  m.def(torch::schema("sequence_gather(Tensor x, int dim, int rank, int degree, int group) -> Tensor",
                      c10::AliasAnalysisKind::CONSERVATIVE),
        &sequenceGatherOp);
  m.def(torch::schema("sequence_scatter(Tensor x, int dim, int rank, int degree, int group) -> Tensor",
                      c10::AliasAnalysisKind::CONSERVATIVE),
        &sequenceScatterOp);
  m.def(torch::schema("vocab_embedding(Tensor weight, Tensor ids, int start, int padding_idx, int group) -> Tensor",
                      c10::AliasAnalysisKind::CONSERVATIVE),
        &vocabEmbeddingOp);
}

}  // namespace

void ensureOpsRegistered() {}

at::Tensor gatherAlong(const at::Tensor& x, int dim, int rank, int degree, int group) {
  return GatherFromGroup::apply(x, dim, rank, degree, group);
}

at::Tensor vocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& target, int rank, int degree,
                                     int group, bool sum, int ignore_index) {
  PIPEFORGE_CHECK(logits.dim() == 2 && target.dim() == 1 && target.size(0) == logits.size(0),
                  "vocabParallelCrossEntropy takes logits [N, b] and targets [N]");
  return VocabCrossEntropy::apply(logits, target.to(at::kLong), rank, degree, group, sum, ignore_index);
}

GroupRegistration::GroupRegistration(AllReduce all_reduce) {
  Groups& g = groups();
  std::lock_guard<std::mutex> lock(g.mutex);
  group_ = g.next++;
  g.all_reduce.emplace(group_, std::move(all_reduce));
}

GroupRegistration::~GroupRegistration() {
  Groups& g = groups();
  std::lock_guard<std::mutex> lock(g.mutex);
  g.all_reduce.erase(group_);
}

}  // namespace pipeforge::tensor_parallel
