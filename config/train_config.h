// The training configuration: one YAML file, parsed once into plain values.
//
// Every key is documented in configs/train_example.yaml. Unknown keys, wrong
// types and values that cannot work (a batch that the microbatches do not
// divide, a missing data file) are ConfigErrors naming the file, the line and
// the dotted key: `train.yaml:14: optimizer.lr must be a number > 0, got 'fast'`.
// Relative paths are taken from the current working directory.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "config/config_overrides.h"
#include "partitioner/split_spec.h"
#include "schedules/program.h"

namespace pipeforge::train {

class ConfigError : public pipeforge::Error {
 public:
  explicit ConfigError(const std::string& message, ErrorCode code = ErrorCode::kUserInput) : Error(code, message) {}
};

struct ModelConfig {
  // A TorchScript model to split before training ...
  std::string path;
  std::string split_spec;  // ... with a split spec file,
  // ... or with split keys inline; either way parsed once, here (errors name
  // the file and line they came from):
  std::optional<partitioner::SplitSpec> spec;
  // ... or an existing split folder (pipe.json + stage_<i>.pt) instead of `path`.
  std::string split_dir;
  // With `path` (a .pt2): the weights by FQN from safetensors files or
  // save_pretrained folders, in order (`pipeforge split --weights`).
  std::vector<std::string> weights;
  bool accept_unused_weights = false;
};

// What a training forward keeps for its backward (runtime Note [Activation checkpointing]).
enum class ActivationCheckpointing {
  kNone,  // every stage's autograd graph
  kFull,  // each stage's inputs only; its backward recomputes the forward
  kEveryN,  // every k-th submodule call of each stage (PipelineConfig::checkpoint_every_n)
  kMicrobatches,  // at most k live microbatches per stage keep their graph (checkpoint_microbatches)
};

// One entry of pipeline.input_chunks / target_chunks: how a model input (or a
// target) is cut into microbatches, as PyTorch's TensorChunkSpec, and so where
// its rows are in the data (Note [Input chunks] in data/data_layout.h).
struct ChunkEntry {
  std::string name;        // the model input it names (input_chunks given as a map); empty in a list
  bool replicate = false;  // every microbatch (and replica) gets the whole tensor
  int dim = 0;             // else: split along this dim
  std::string where;       // file:line of the entry, for errors found against the split
};

struct PipelineConfig {
  // A name from schedules::scheduleNames(), or "auto": profile the stages and
  // search for the fastest schedule (train/schedule_choice.h).
  std::string schedule = "1F1B";
  // A PyTorch-format schedule CSV (compute_only or compute_comms) instead of
  // `schedule`, and the program read from it.
  std::string schedule_csv;
  std::optional<schedules::Program> csv_program;
  int microbatches = 1;
  int stages_per_rank = 1;
  int data_parallel = 1;  // world = pipeline ranks x tensor_parallel x data_parallel
  // Tensor parallel inside each stage (Megatron's column/row split, planned
  // from the stage's graph: tensor_parallel/tp_plan.h): every stage runs on
  // this many neighbouring ranks, each holding its slice of the split layers.
  int tensor_parallel = 1;
  // How the layers are split: "auto" finds the column/row pairs in each
  // stage's graph; or torchtitan's plan by FQN glob, {"*.q_proj": colwise,
  // "*.o_proj": rowwise, ...}, in `tensor_parallel_styles` (linears it does
  // not name run whole; a plan that does not fit the graph is refused).
  std::string tensor_parallel_plan = "auto";
  std::vector<std::pair<std::string, std::string>> tensor_parallel_styles;  // (glob, colwise | rowwise | replicated | vocab)
  // Megatron's sequence parallel over the tensor-parallel group: between a
  // row linear and the next column, each rank holds its part of the sequence.
  bool sequence_parallel = false;
  // Loss parallel (Megatron's vocab-parallel cross-entropy, torchtitan's
  // default): with tensor_parallel >= 2 and loss cross_entropy, lm_head is
  // split by vocabulary and the loss read from the split logits, never
  // gathered. false keeps lm_head whole on every rank.
  bool loss_parallel = true;
  // ZeRO across the data-parallel replicas (ColossalAI's key): 0 keeps every
  // stage whole on every replica; 1 shards the optimizer state (Note
  // [Sharded optimizer] in sharding/sharded_stage.cpp), 2 the gradients too
  // (Note [Sharded gradients]), 3 the parameters too, gathered by UNSHARD
  // and released by RESHARD (Note [Sharded parameters]).
  int zero_stage = 0;
  // zero_stage 3: at most this many stages per rank unsharded at once
  // (PyTorch's _add_unshard_reshard, default 3).
  int max_active_stages = 3;
  // PyTorch's scale_grads: false sums the microbatches' losses (and their
  // gradients) instead of averaging them; the step's reported loss is then
  // that sum (Note [Loss scaling] in runtime/pipeline_runner.cpp).
  bool scale_grads = true;
  // MegatronInterleaved only: Megatron's microbatch_group_size_per_vp_stage
  // (the microbatches one model chunk runs before the next); 0: Megatron's
  // default, the pipeline ranks.
  int microbatch_group_size = 0;
  ActivationCheckpointing activation_checkpointing = ActivationCheckpointing::kNone;
  int checkpoint_every_n = 0;  // kEveryN only: k >= 1
  int checkpoint_microbatches = 0;  // kMicrobatches only: k >= 0 (0: every one recomputed, as full)
  // data.format tensors only; empty: every input (target) split along dim 0.
  // input_chunks is a list in the model's input order or a map by input name
  // (then every entry has a name); target_chunks is a list.
  std::vector<ChunkEntry> input_chunks;
  std::vector<ChunkEntry> target_chunks;
  // PyTorch's output_merge_spec, for `eval --outputs`: per model output, the
  // dim its microbatches (replicas, batches) are joined along, or replicate
  // (the first microbatch's is kept). Empty: the first input's chunk dim.
  std::vector<ChunkEntry> output_chunks;
  // Bytes one rank may hold for its stages: parameters, gradients and
  // optimizer state, plus the schedule's peak activation memory. With
  // `schedule: auto` the search keeps the simulated peak under what the
  // model state leaves (Note [Memory-aware auto] in train/auto_schedule_pick.h).
  std::optional<double> memory_limit;
};

enum class LossName {
  kCrossEntropy,
  kMse,
  kModule,  // TrainConfig::loss_module: a scripted or exported (outputs..., targets...) -> scalar module
};
// How the microbatches' losses make the step's loss (Note [Per-token loss] in train/runner_options.cpp).
enum class LossNormalization {
  kPerMicrobatch,  // the mean of each microbatch's mean loss (PyTorch's scale_grads)
  kPerToken,       // the sum of every element's loss over the whole global batch, divided by the
                   // number of counted elements (Megatron's calculate_per_token_loss)
};
enum class OptimizerName { kSgd, kAdam, kAdamW };
enum class LrDecay { kCosine, kConstant };
// What a step whose loss or gradients are NaN or infinite does (Note [Non-finite steps]).
enum class NonFinitePolicy {
  kStop,      // every rank exits non-zero, naming the step and the first stage
  kSkipStep,  // every rank drops that step's update; counted in the metrics
};

// The dtype the forward computes in (Note [Mixed precision] in runtime/schedule_executor.cpp).
enum class PrecisionName { kFp32, kBf16, kFp16 };

// fp16 only: dynamic loss scaling as torch.amp.GradScaler (Note [Dynamic
// loss scaling] in train/loss_scaler.h); growth 2.0 and backoff 0.5 are fixed.
struct LossScaleConfig {
  double initial = 65536.0;             // GradScaler's init_scale, 2**16
  std::int64_t growth_interval = 2000;  // overflow-free steps before the scale doubles
};

struct LrScheduleConfig {
  LrDecay decay = LrDecay::kCosine;
  std::int64_t warmup_steps = 0;
  std::optional<std::int64_t> decay_steps;  // unset: training.steps
  double min_lr = 0.0;
};

struct OptimizerConfig {
  OptimizerName name = OptimizerName::kAdamW;
  double lr = 1e-3;
  double weight_decay = 0.0;
  std::array<double, 2> betas{0.9, 0.999};
  double eps = 1e-8;
  double momentum = 0.0;  // SGD only
  bool nesterov = false;  // SGD only
  // Adam and AdamW as PyTorch's foreach=True (its _foreach_ ops) or
  // fused=True (one kernel for all tensors); neither: LibTorch's
  // per-parameter loop (Note [Adam implementations] in train/optimizer_factory.cpp).
  bool foreach = false;
  bool fused = false;
  // The global gradient norm (every stage and replica, a tied parameter
  // counted once) is scaled down to at most this, as
  // torch.nn.utils.clip_grad_norm_ on the whole model; 0: no clipping.
  double clip_grad_norm = 0.0;
  // FQN globs (fnmatch: `*` also crosses dots) whose parameters get weight
  // decay 0, as a second PyTorch param group (Note [No-decay groups]).
  std::vector<std::string> no_decay;
};

enum class DataFormat {
  kTokens,   // a nanoGPT .bin file of uint16 or uint32 tokens
  kText,     // any file, one token per byte (vocabulary 256)
  kTensors,  // torch.save'd {"inputs": ..., "targets": ...} or a TorchScript holder
};
enum class TokenDtype { kUint8, kUint16, kUint32 };
// How token data becomes rows (Note [Variable sequence lengths] in data/token_dataset.cpp).
enum class Packing {
  kWindows,  // every row a block_size window of the stream, documents packed back to back (nanoGPT)
  kNone,     // every row one document, cut at block_size + 1 tokens; each microbatch padded to its longest row
};

struct DataConfig {
  DataFormat format = DataFormat::kTokens;
  std::string path;
  std::string val_path;        // held-out data; empty: the tail of `path`
  double val_fraction = 0.1;   // share of `path` held out when val_path is empty
  TokenDtype dtype = TokenDtype::kUint16;  // kTokens only (kText is always uint8)
  std::int64_t block_size = 0;             // kTokens and kText
  Packing packing = Packing::kWindows;     // kTokens and kText
  // kNone: the token that ends each document (GPT-2's <|endoftext|> is
  // 50256); the rows' inputs are padded with it, their targets with -1.
  std::int64_t document_separator = -1;
};

struct CheckpointConfig {
  std::string dir;          // empty: no checkpoints
  std::int64_t every = 0;   // steps between checkpoints; 0: only at the end
  int keep = 0;             // newest checkpoints kept; 0: all
  bool resume = true;       // continue from dir/latest when it exists
};

struct TrainConfig {
  std::string origin;  // the file it came from, for messages

  ModelConfig model;
  PipelineConfig pipeline;
  LossName loss = LossName::kCrossEntropy;
  std::string loss_module;  // kModule: a TorchScript (.pt) or torch.export (.pt2) loss
  LossNormalization loss_normalization = LossNormalization::kPerMicrobatch;
  OptimizerConfig optimizer;
  LrScheduleConfig lr_schedule;
  DataConfig data;

  std::int64_t steps = 0;
  std::int64_t global_batch_size = 0;
  std::uint64_t seed = 1337;
  std::int64_t eval_every = 0;    // 0: no evaluation
  std::int64_t eval_batches = 1;  // held-out batches per evaluation
  NonFinitePolicy on_nonfinite = NonFinitePolicy::kStop;
  PrecisionName precision = PrecisionName::kFp32;
  LossScaleConfig loss_scale;  // used with precision fp16 only

  CheckpointConfig checkpoint;

  std::string device = "cpu";    // cpu | cuda | cuda:N
  std::string backend = "auto";  // auto | gloo | nccl
  bool cpu_affinity = true;      // auto: --nproc ranks on reserved cores (Note [One core range per rank]) | none
  double timeout_s = 120.0;

  std::string output_dir;        // metrics.jsonl, trace.json, stages/
  std::int64_t log_every = 1;
  bool trace = false;
  std::int64_t trace_steps = 2;  // steps recorded in the trace (the last ones)
};

// Parses YAML text; `origin` names it in messages. Checks what the text alone
// decides (types, ranges, divisibility, files that must exist). `overrides`
// (from the command line, Note [Config overrides]) replace keys of the text
// first, and are checked as the text's keys are.
TrainConfig parseTrainConfig(const std::string& yaml_text, const std::string& origin,
                             const std::vector<ConfigOverride>& overrides = {});
TrainConfig loadTrainConfig(const std::string& path, const std::vector<ConfigOverride>& overrides = {});

// Checks the layout against the job: `world_size` ranks, and a split with
// `num_stages` stages (and pipeline.schedule_csv's rows and stages against
// them). Throws ConfigError naming the keys to change. Returns the
// compute-only program the layout runs: the CSV's, or pipeline.schedule
// generated for it; nullopt for `auto`, which is chosen while training.
std::optional<schedules::Program> checkLayout(const TrainConfig& config, int world_size, int num_stages);

// pipeline.input_chunks in the order of `model_inputs` (pipe.json's input
// names), an input a map leaves out split along dim 0; empty when unset.
// Throws ConfigError for a list of another length or a name the model lacks.
std::vector<ChunkEntry> inputChunksFor(const TrainConfig& config, const std::vector<std::string>& model_inputs);

// What metrics, progress and checkpoints call the schedule: its name, "auto",
// or the CSV file's path.
std::string scheduleLabel(const TrainConfig& config);

// Rows of the global batch each data-parallel replica trains on.
std::int64_t replicaBatchSize(const TrainConfig& config);

const char* lossName(LossName loss);
const char* optimizerName(OptimizerName name);
const char* precisionName(PrecisionName name);

}  // namespace pipeforge::train
