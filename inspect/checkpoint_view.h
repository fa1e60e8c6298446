// `pipeforge inspect CKPT`: a checkpoint's step, layout, tensors (FQN,
// dtype, shape) and optimizer state, from its meta.json and stage indexes
// (stage_<i>.json) alone: no tensor is read, whatever the model's size.
#pragma once

#include <optional>
#include <string>

namespace pipeforge::inspect {

// Whether `path` is a checkpoint folder (step_<N>/ with meta.json) or a
// checkpoint root (with a `latest` pointer).
bool isCheckpointPath(const std::string& path);

// The checkpoint `path` names (CKPT uses `latest`), as text or JSON;
// `stage`: only that stage's tensors. Throws CheckpointError for a folder
// that is not a checkpoint or a stage it does not have.
std::string checkpointText(const std::string& path, std::optional<int> stage);
std::string checkpointJson(const std::string& path, std::optional<int> stage);

}  // namespace pipeforge::inspect
