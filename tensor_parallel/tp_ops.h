// The collectives of a tensor-parallel stage as TorchScript ops with their
// own autograd (Megatron's f and g, Note [Tensor-parallel collectives]):
//
//   pipeforge_tp::copy(Tensor x, int group) -> Tensor
//       forward: x as it is; backward: the gradient summed over the group.
//       Put where a replicated value enters the split part of a layer.
//   pipeforge_tp::reduce(Tensor x, int group) -> Tensor
//       forward: x summed over the group; backward: the gradient as it is.
//       Put after a row-split linear, whose output each rank holds a part of.
//   pipeforge_tp::gather(Tensor x, int dim, int rank, int degree, int group) -> Tensor
//       forward: the whole tensor from every rank's block along `dim`;
//       backward: this rank's block of the gradient. Where a split value
//       leaves the stage (a pipeline cut between a column and a row linear).
//   pipeforge_tp::sequence_gather(Tensor x, int dim, int rank, int degree, int group) -> Tensor
//       forward: all-gather along `dim`; backward: reduce-scatter (the sum
//       over the group, this rank's block). Sequence parallel, before a
//       column linear.
//   pipeforge_tp::sequence_scatter(Tensor x, int dim, int rank, int degree, int group) -> Tensor
//       forward: reduce-scatter along `dim`; backward: all-gather. Sequence
//       parallel, after a row linear (instead of reduce).
//   pipeforge_tp::vocab_embedding(Tensor weight, Tensor ids, int start, int padding_idx, int group) -> Tensor
//       this rank's rows [start, start + weight.size(0)) of an embedding:
//       ids outside them look up zeros, and the lookups are summed over the
//       group; backward: the gradient of this rank's rows only.
//
// `group` is a number from registerGroup: the rewritten stage graph holds it
// as a constant, and the op looks up the all-reduce at run time. One process
// may hold several groups (the tests run every rank of a group in threads).
#pragma once

#include <functional>
#include <memory>

namespace at {
class Tensor;
}

namespace pipeforge::tensor_parallel {

inline constexpr const char* kCopyOp = "pipeforge_tp::copy";
inline constexpr const char* kReduceOp = "pipeforge_tp::reduce";
inline constexpr const char* kGatherOp = "pipeforge_tp::gather";
inline constexpr const char* kSequenceGatherOp = "pipeforge_tp::sequence_gather";
inline constexpr const char* kSequenceScatterOp = "pipeforge_tp::sequence_scatter";
inline constexpr const char* kVocabEmbeddingOp = "pipeforge_tp::vocab_embedding";

// Sums `tensor` in place over the tensor-parallel group (the caller's
// communicator), blocking until every rank of the group has joined.
using AllReduce = std::function<void(const at::Tensor& tensor)>;

// Megatron's vocab-parallel cross-entropy (loss parallel; Note
// [Vocab-parallel cross-entropy]): `logits` [N, b] are this rank's block of
// the vocabulary, columns [rank·b, (rank+1)·b) of [N, degree·b], and
// `target` [N] the class indices over the whole vocabulary (`ignore_index`
// rows add nothing). Returns what at::cross_entropy_loss returns on the
// gathered logits (the mean over the counted rows, or their sum with `sum`),
// the same on every rank, without gathering them: two all-reduces of [.., N]
// over `group`. Backward is local, this rank's block of the gradient. Throws
// Error (kUserInput) for a target outside [0, degree·b).
at::Tensor vocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& target, int rank, int degree,
                                     int group, bool sum, int ignore_index = -1);

// pipeforge_tp::gather as a C++ call: the whole tensor from every rank's
// block of `x` along `dim`; backward keeps this rank's block of the
// gradient. A stage whose input arrives as a sequence shard (Note [Sequence
// shards across cuts] in tp_plan.cpp) runs on its gather.
at::Tensor gatherAlong(const at::Tensor& x, int dim, int rank, int degree, int group);

// Makes the ops known to TorchScript (a no-op after the first call; linking
// this library registers them, the call keeps the linker from dropping it).
void ensureOpsRegistered();

// Holds `all_reduce` under a group number until destroyed.
class GroupRegistration {
 public:
  explicit GroupRegistration(AllReduce all_reduce);
  ~GroupRegistration();
  GroupRegistration(const GroupRegistration&) = delete;
  GroupRegistration& operator=(const GroupRegistration&) = delete;

  int group() const { return group_; }

 private:
  int group_;
};

}  // namespace pipeforge::tensor_parallel
