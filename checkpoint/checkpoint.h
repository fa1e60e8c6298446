// Checkpoints: one folder per step, one pair of files per pipeline stage.
//
//   CKPT/latest                 "step_00000040\n", written last (Note [Checkpoint commit])
//   CKPT/step_00000040/meta.json   step, stages, layout, source model, tied
//                                  names, the fp16 loss scale, file digests
//   CKPT/step_00000040/stage_0.pt  a torch.save-compatible dict: parameters and
//                                  buffers under their original FQNs, step,
//                                  data position, the rank's RNG state, and the
//                                  optimizer's state per parameter FQN
//   CKPT/step_00000040/stage_0.json   the stage's index: every tensor's FQN,
//                                  dtype and shape, and which optimizer state
//                                  it holds (what `inspect CKPT` and an
//                                  elastic resume read without the tensors)
//
// Format 2 ("pipeforge.checkpoint/2") keeps everything by FQN, so a run
// resumes on any layout of the same model (Note [Elastic resume] in
// train/rank_checkpoint.cpp). Format 1 kept each stage's optimizer in a
// stage_0.optim.pt torch::serialize archive, keyed by parameter position:
// those checkpoints still resume, on the split that wrote them.
//
// Note [Checkpoint commit]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Every rank writes its stages' files into step_N.partial/ (each through a
// temporary name, fsync and a rename), then all ranks meet at a barrier: past
// it, every file of the step is durable wherever it was written. One process
// per host (its lowest rank) then lists what its folder holds and sends it
// to rank 0, which sends every such leader what all folders hold; each leader
// writes meta.json (every file's SHA-256, and which hosts wrote it), adds the
// stage indexes its folder lacks, and renames the folder to step_N. After a
// second barrier (every host's folder is complete) the leaders move `latest`.
// So `latest` moves only once every rank's files of the step are durable, and
// a rank or host lost at any moment leaves the previous checkpoint as
// `latest` (a step_N.partial/ that a resume names in a warning), never a
// torn one.
//
// Note [Checkpoints on each host's own disk]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// checkpoint.dir need not be shared: on local disks each host's step folder
// holds the stage files its own ranks wrote, every stage's index, and a
// meta.json that names every file, its digest, and the hosts that hold it.
// The same hosts and ranks resume from their own folders. A resume that
// needs a stage file another host holds (another layout, fewer hosts) is
// refused, naming that host and the fix: copy that host's step folder into
// this one (`rsync -a --ignore-existing`), after which the digests in
// meta.json check the copied files. Ranks agree on the step they resume from:
// the newest one every rank finds intact (Note [Resume agreement] in
// train/rank_checkpoint.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/error.h"

namespace torch::optim {
class Optimizer;
}

namespace pipeforge::train {

class CheckpointError : public pipeforge::Error {
 public:
  explicit CheckpointError(const std::string& message, ErrorCode code = ErrorCode::kUserInput) : Error(code, message) {}
};

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// One parameter's optimizer state, its slots named as PyTorch's optimizers
// name them in state_dict(): "exp_avg", "exp_avg_sq" (Adam, AdamW),
// "momentum_buffer" (SGD with momentum). Adam's step count is `step`.
struct ParameterOptimizerState {
  std::optional<std::int64_t> step;
  NamedTensors slots;
};

// A stage's optimizer state by the original FQN of each parameter. A
// parameter the optimizer never stepped (or SGD without momentum) has none.
struct StageOptimizerState {
  std::string name;  // the config's optimizer.name: "sgd", "adam", "adamw"
  std::map<std::string, ParameterOptimizerState> by_name;
};

// Note [Sharded checkpoints]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With pipeline.zero_stage 1 or more, each data-parallel rank holds only its
// piece of every parameter's optimizer state (Note [Shards] in
// sharding/shard_layout.h), and writes only that: the stage file keeps the
// parameters and buffers, with an empty optimizer state and
// "optimizer_shards": d, and each of the d ranks writes
// stage_<i>.optim_shard_<k>.pt, a torch.load-able dict:
//   {"format", "stage", "step", "shard": k, "shards": d,
//    "optimizer": {"name", "state": {FQN: {"step", "exp_avg": 1-D piece, ...}}},
//    "ranges": {FQN: [begin, end, numel]}}
// where a piece holds elements [begin, end) of the FQN's flattened state
// (numel elements whole). No rank gathers a stage to save it. A resume
// assembles any range of any parameter's state from the pieces, so it runs
// on another zero stage or data-parallel size, or without sharding.
// With zero_stage 3 no rank holds a parameter whole between steps either:
// the stage file's "parameters" is empty and it says "parameter_shards": d,
// and each shard file adds its pieces of the parameters, at the same ranges,
// and every parameter's whole shape:
//    "parameters": {FQN: 1-D piece}, "shapes": {FQN: [dims]}
// readStageCheckpoint assembles them, so what reads a checkpoint's
// parameters (a resume, `pipeforge export`, safetensors) sees them whole.

// One data-parallel rank's piece of a stage's optimizer state.
struct OptimizerShard {
  int shard = 0;   // this rank's place in the data-parallel group
  int shards = 1;  // the group's size
  // FQN -> elements [begin, end) of the flattened tensor, and its numel.
  struct Range {
    std::int64_t begin = 0;
    std::int64_t end = 0;
    std::int64_t numel = 0;
  };
  std::map<std::string, Range> ranges;
  StageOptimizerState optimizer;  // 1-D pieces, by FQN
  // zero_stage 3: the parameters' pieces too (1-D, at `ranges`; a piece may
  // be empty), and each parameter's whole shape. Empty otherwise.
  NamedTensors parameters;
  std::map<std::string, std::vector<std::int64_t>> shapes;
};

// What one stage saves and restores.
struct StageCheckpoint {
  int stage = 0;
  std::int64_t step = 0;           // optimizer steps done
  std::int64_t data_position = 0;  // training batches consumed (== step: Note [Stateless sampling])
  NamedTensors parameters;         // original FQNs
  NamedTensors buffers;
  at::Tensor rng_state;            // the CPU generator's state on the rank that held the stage
  at::Tensor device_rng_state;     // its CUDA device's generator (undefined on CPU, and in older checkpoints)
  StageOptimizerState optimizer;   // empty in format-1 checkpoints (stage_<i>.optim.pt)
  // ZeRO: this rank's piece of the optimizer state instead of `optimizer`
  // (Note [Sharded checkpoints]). On reading, only `optimizer_shards` is set.
  std::optional<OptimizerShard> optimizer_shard;
  int optimizer_shards = 0;  // 0: the state is whole in `optimizer`
  // On reading: how many shard files the parameters were assembled from (0:
  // they were whole in the stage file). On writing, optimizer_shard's
  // `parameters` say it.
  int parameter_shards = 0;
};

// stage_<i>.json: a stage's tensors without their values. Tensors are
// described as pipe.json describes values ("float32[64, 32]").
struct StageIndex {
  int stage = 0;
  std::int64_t step = 0;
  std::map<std::string, std::string> parameters;  // FQN -> "float32[64, 32]"
  std::map<std::string, std::string> buffers;
  std::string optimizer;                          // optimizer.name
  // FQN -> the optimizer state it holds ("step", "exp_avg", ...).
  std::map<std::string, std::vector<std::string>> optimizer_state;
  int optimizer_shards = 0;  // Note [Sharded checkpoints]; 0: whole in the stage file
  int parameter_shards = 0;  // zero_stage 3: the parameters too
};

// How the run that wrote a checkpoint was laid out (format 2).
struct CheckpointLayout {
  int pipeline_ranks = 1;
  int data_parallel = 1;
  int stages_per_rank = 1;
  int zero_stage = 0;  // pipeline.zero_stage; absent in older checkpoints
};

// fp16 runs: the loss scaler's state after the checkpoint's step (Note [Dynamic loss scaling]).
struct LossScaleState {
  double scale = 65536.0;
  std::int64_t growth_tracker = 0;
};

struct CheckpointMeta {
  int format_version = 2;      // 1: per-stage optimizer archives, same split only
  std::int64_t step = 0;
  int num_stages = 0;
  std::string source;          // the original model file, from pipe.json
  std::string schedule;
  int world_size = 1;
  std::uint64_t seed = 0;
  std::vector<std::vector<std::string>> tied;
  std::vector<std::string> unused;  // pipe.json "unused": model state no stage holds
  std::optional<LossScaleState> loss_scale;  // fp16 runs only; absent in older checkpoints
  // The sequence length the run trained on (data.block_size of text data);
  // `pipeforge generate`'s default context. Absent for tensor data and in
  // older checkpoints.
  std::optional<std::int64_t> block_size;
  std::optional<CheckpointLayout> layout;  // absent in format 1
};

inline constexpr const char* kCheckpointFormat = "pipeforge.checkpoint/2";
inline constexpr const char* kCheckpointFormatV1 = "pipeforge.checkpoint/1";

// CKPT/step_<step, 8 digits>.
std::string checkpointDir(const std::string& root, std::int64_t step);
std::string partialCheckpointDir(const std::string& root, std::int64_t step);

// Removes leftovers of an interrupted write of `step` (partial and final
// folders). Call on one process per host, before the writers start.
void clearCheckpointStep(const std::string& root, std::int64_t step);

// Writes stage_<i>.pt and stage_<i>.json into the partial folder.
void writeStageCheckpoint(const std::string& root, const StageCheckpoint& state);

// What one checkpoint folder holds of a step (Note [Checkpoint commit]):
// the host, each file's SHA-256 and each stage index's text.
struct FolderContents {
  std::string host;
  std::map<std::string, std::string> digests;  // file name -> SHA-256
  std::map<std::string, std::string> indexes;  // stage_<i>.json -> its text
};
std::string folderContentsToJson(const FolderContents& contents);
// Throws CheckpointError naming `from` when `text` is not one.
FolderContents folderContentsFromJson(const std::string& text, const std::string& from);

// The files of step_N.partial/ under `root`, hashed, as written on `host`.
FolderContents listPartialCheckpoint(const std::string& root, std::int64_t step, const std::string& host);

// One leader per folder, past the barrier that ends the writes: writes the
// indexes `others` hold and this folder lacks, meta.json (files: this
// folder's digests, then the others'; hosts: which hosts hold each file)
// and renames step_N.partial to step_N. Throws CheckpointError when a stage
// file is in no folder at all. Leaders sharing one folder may race; the
// first rename wins.
void sealCheckpoint(const std::string& root, const CheckpointMeta& meta, const FolderContents& own,
                    const std::vector<FolderContents>& others);

// After every folder was sealed: `latest` names step N; then all but the
// `keep` newest step folders are dropped (keep 0: none dropped).
void pointLatest(const std::string& root, std::int64_t step, int keep);

// One folder that holds every stage (one process, or a shared folder seen
// by a lone leader): sealCheckpoint, then pointLatest.
void commitCheckpoint(const std::string& root, const CheckpointMeta& meta, int keep);

// The folder `latest` names, if any. Throws CheckpointError when `latest`
// names a folder that is missing.
std::optional<std::string> latestCheckpoint(const std::string& root);

// Checks every file of a committed step folder against the SHA-256 its
// meta.json records (Note [File digests]); throws CheckpointError naming the
// first corrupt or missing file. A file that meta.json places on other hosts
// only (Note [Checkpoints on each host's own disk]) may be absent: reading
// it is refused then, naming the host. Folders written before digests pass.
void verifyCheckpoint(const std::string& step_dir);

// The checkpoint to resume from: `latest`, or, when its files are corrupt,
// the newest older step folder that verifies; `warning` then says which was
// skipped and why, and names newer step_N.partial folders a lost rank left. nullopt when there is none at all; throws CheckpointError
// when every kept checkpoint is corrupt.
std::optional<std::string> newestIntactCheckpoint(const std::string& root, std::string* warning);

// A checkpoint folder given as CKPT (uses `latest`) or CKPT/step_N.
std::string resolveCheckpoint(const std::string& path);

CheckpointMeta readCheckpointMeta(const std::string& step_dir);
// stage_<i>.optim_shard_<k>.pt (Note [Sharded checkpoints]); throws
// CheckpointError for a missing or malformed file.
OptimizerShard readOptimizerShard(const std::string& step_dir, int stage, int shard);
std::string optimizerShardFile(int stage, int shard);
StageCheckpoint readStageCheckpoint(const std::string& step_dir, int stage);
// stage_<i>.json of a format-2 checkpoint; reads no tensor.
StageIndex readStageIndex(const std::string& step_dir, int stage);
// Format 1 only: stage_<i>.optim.pt into an optimizer built over the same
// parameters in the same order as the run that wrote it.
void loadOptimizerState(const std::string& step_dir, int stage, torch::optim::Optimizer& optimizer);

}  // namespace pipeforge::train
