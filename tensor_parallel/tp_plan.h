// Tensor parallel inside one stage, planned from its graph (issue 44).
//
// planTensorParallel reads a stage's forward (every module call opened) and
// finds the pattern Megatron writes by hand (Note [Planning from the graph]):
// a linear split by output features (column), ops that act per head or per
// feature, then a linear split by input features (row) whose partial outputs
// are summed. It needs no plan per model: transformers' Llama, Qwen2,
// Mistral and Gemma come out as their own `base_model_tp_plan` says.
// shardForTensorParallel applies a plan for one rank: its slices of the
// split weights, the collectives of tp_ops.h, and the literal sizes
// (a head count written into a reshape) divided by the degree.
#pragma once

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"

namespace at {
class Tensor;
}
namespace torch::jit {
struct Module;
}

namespace pipeforge::tensor_parallel {

// What cannot be split exactly: names the module, the source line, why, and
// what to change. Raised before any rank trains.
class TpPlanError : public Error {
 public:
  explicit TpPlanError(const std::string& message) : Error(ErrorCode::kUserInput, message) {}
};

enum class LinearSplit {
  kColumn,  // output features split: weight rows (and bias) cut in `degree` blocks
  kRow,     // input features split: weight columns cut; outputs summed, then the bias
  kWhole,   // every rank runs it whole (`why` says why)
  kVocab,   // an embedding's rows cut in `degree` blocks; lookups summed (Megatron's VocabParallelEmbedding)
};

// "colwise", "rowwise", "replicated", "embedding_rowwise": torchtitan's and
// transformers' words.
const char* styleName(LinearSplit split);

struct PlannedLinear {
  std::string module;  // FQN, "model.layers.0.self_attn.q_proj"
  LinearSplit split = LinearSplit::kWhole;
  std::string source;  // "modeling_llama.py:254"
  std::string why;     // for kWhole
};

struct SplitParameter {
  std::string fqn;
  int dim = 0;           // cut along this dim in `degree` equal blocks
  long long size = 0;    // the whole size of that dim
};

struct TpPlan {
  int degree = 1;
  std::vector<PlannedLinear> linears;       // the embeddings, then the linears in graph order
  std::vector<SplitParameter> parameters;   // the split ones; every other parameter is whole on each rank
  int copies = 0;   // f ops: replicated values entering a split region
  int reduces = 0;  // g ops: one per row linear
  int gathers = 0;  // split stage outputs gathered whole (a stage cut inside a col/row pair)
  int sequence_gathers = 0;  // sequence parallel: column inputs gathered along the sequence
  int resized = 0;  // literal sizes divided by the degree
  // Stage outputs left split along their last dim, for the vocab-parallel
  // cross-entropy (TpOptions::vocab_parallel_outputs): each rank returns its
  // block of the vocabulary, in rank order.
  std::vector<int> vocab_split_outputs;
  // Sequence parallel: stage outputs left as this rank's part of the
  // sequence, (output, dim), for the next stage to gather
  // (TpOptions::sequence_shard_outputs).
  std::vector<std::pair<int, int>> sequence_shard_outputs;

  // {module FQN: "colwise" | "rowwise" | "embedding_rowwise"}, what is split.
  std::map<std::string, std::string> styles() const;
  // One line per linear, then the counts.
  std::string describe() const;
};

// An explicit plan, in torchtitan's words: (module FQN glob, "colwise" |
// "rowwise" | "replicated" | "vocab"), first match wins; a linear or
// embedding no glob names runs whole. Empty: the plan is found in the graph.
using TpStyles = std::vector<std::pair<std::string, std::string>>;

struct TpOptions {
  TpStyles styles;
  // Megatron's sequence parallel: what runs between a row linear and the
  // next column (norms, residual adds, dropout) runs on each rank's part of
  // the sequence (Note [Sequence parallel]).
  bool sequence_parallel = false;
  // Parameters tied to a copy in another stage (pipe.json "tied"), whose
  // gradients the runtime sums with the copies': no split cuts them...
  std::set<std::string> keep_whole;
  // ... but, when set, one read here by an embedding or a column linear is
  // split along dim 0 as the other stages split their copies (Note [Tied
  // vocabulary]: a tied embedding and lm_head, with loss parallel). The
  // caller checks that every copy was split alike.
  bool split_tied = false;
  // Loss parallel: the stage outputs (flat indices) that the loss reads as
  // logits with the vocab-parallel cross-entropy (tp_ops.h). One split along
  // its last dim (lm_head's columns) leaves the stage split instead of
  // making its columns whole; TpPlan::vocab_split_outputs lists them.
  std::set<int> vocab_parallel_outputs;
  // Sequence parallel: the stage outputs (flat indices) that may leave as
  // the rank's part of the sequence instead of gathered whole (the next
  // stage's inputs, which it gathers: Note [Sequence shards across cuts]).
  std::set<int> sequence_shard_outputs;
};

// Plans `stage` for `degree` ranks. `example_inputs` are the forward's
// inputs at the shapes it runs (one dry forward without grad records every
// value's shape). Throws TpPlanError for what cannot be split exactly, and
// when degree > 1 and nothing can be split at all. With explicit styles the
// plan is theirs, checked against the graph: a style the graph contradicts
// (a rowwise whose input arrives whole) is refused, naming it.
TpPlan planTensorParallel(const torch::jit::Module& stage, const std::vector<at::Tensor>& example_inputs, int degree,
                          const TpOptions& options = {});

// A copy of `stage` as rank `rank` of `degree` runs it: its parameter
// slices, and a forward with the collectives over `group`
// (GroupRegistration::group()). `stage` is not changed. `plan_out`, when
// given, receives the plan.
torch::jit::Module shardForTensorParallel(const torch::jit::Module& stage, const std::vector<at::Tensor>& example_inputs,
                                          int degree, int rank, int group, TpPlan* plan_out = nullptr,
                                          const TpOptions& options = {});

}  // namespace pipeforge::tensor_parallel
