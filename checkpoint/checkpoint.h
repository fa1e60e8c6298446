// Checkpoints: one folder per step, one pair of files per pipeline stage.
//
//   CKPT/latest                 "step_00000040\n", written last (Note [Checkpoint commit])
//   CKPT/step_00000040/meta.json   step, stages, source model, tied names, world,
//                                  the fp16 loss scale
//   CKPT/step_00000040/stage_0.pt  a torch.save-compatible dict: parameters and
//                                  buffers under their original FQNs, step,
//                                  data position, the rank's RNG state
//   CKPT/step_00000040/stage_0.optim.pt   the stage's optimizer (torch::serialize archive)
//
// Note [Checkpoint commit]: every rank writes its stages' files into
// step_N.partial/ (each file through a temporary name and a rename); after a
// barrier one process per host renames the folder to step_N and then
// replaces `latest`. A rank killed at any moment leaves either the previous
// checkpoint or the new one as `latest`, never a torn one.
#pragma once

#include <cstdint>
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

// What one stage saves and restores.
struct StageCheckpoint {
  int stage = 0;
  std::int64_t step = 0;           // optimizer steps done
  std::int64_t data_position = 0;  // training batches consumed (== step: Note [Stateless sampling])
  NamedTensors parameters;         // original FQNs
  NamedTensors buffers;
  at::Tensor rng_state;            // the CPU generator's state on the rank that held the stage
  at::Tensor device_rng_state;     // its CUDA device's generator (undefined on CPU, and in older checkpoints)
};

// fp16 runs: the loss scaler's state after the checkpoint's step (Note [Dynamic loss scaling]).
struct LossScaleState {
  double scale = 65536.0;
  std::int64_t growth_tracker = 0;
};

struct CheckpointMeta {
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
};

inline constexpr const char* kCheckpointFormat = "pipeforge.checkpoint/1";

// CKPT/step_<step, 8 digits>.
std::string checkpointDir(const std::string& root, std::int64_t step);
std::string partialCheckpointDir(const std::string& root, std::int64_t step);

// Removes leftovers of an interrupted write of `step` (partial and final
// folders). Call on one process per host, before the writers start.
void clearCheckpointStep(const std::string& root, std::int64_t step);

// Writes stage_<i>.pt and stage_<i>.optim.pt into the partial folder.
void writeStageCheckpoint(const std::string& root, const StageCheckpoint& state,
                          torch::optim::Optimizer& optimizer);

// Once every stage was written: meta.json, the rename, then `latest`; then
// drops all but the `keep` newest step folders (keep 0: none dropped).
void commitCheckpoint(const std::string& root, const CheckpointMeta& meta, int keep);

// The folder `latest` names, if any. Throws CheckpointError when `latest`
// names a folder that is missing.
std::optional<std::string> latestCheckpoint(const std::string& root);

// Checks every file of a committed step folder against the SHA-256 its
// meta.json records (Note [File digests]); throws CheckpointError naming the
// first corrupt or missing file. Folders written before digests pass.
void verifyCheckpoint(const std::string& step_dir);

// The checkpoint to resume from: `latest`, or, when its files are corrupt,
// the newest older step folder that verifies; `warning` then says which was
// skipped and why. nullopt when there is none at all; throws CheckpointError
// when every kept checkpoint is corrupt.
std::optional<std::string> newestIntactCheckpoint(const std::string& root, std::string* warning);

// A checkpoint folder given as CKPT (uses `latest`) or CKPT/step_N.
std::string resolveCheckpoint(const std::string& path);

CheckpointMeta readCheckpointMeta(const std::string& step_dir);
StageCheckpoint readStageCheckpoint(const std::string& step_dir, int stage);
void loadOptimizerState(const std::string& step_dir, int stage, torch::optim::Optimizer& optimizer);

}  // namespace pipeforge::train
