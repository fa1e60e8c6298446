// `pipeforge export`: the original model with the trained weights of a
// checkpoint: a TorchScript .pt for torch.jit.load, or, from a .pt2 model and
// with --out *.pt2, the original archive with new weights for torch.export.load.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pipeforge::train {

struct ExportRequest {
  std::string checkpoint;  // CKPT (its `latest`) or CKPT/step_<N>
  std::string model_path;  // the model the split came from
  std::string out_path;
  bool force = false;      // replace an existing out_path
  // "safetensors": out_path is a folder of what save_pretrained writes
  // (Note [Exporting safetensors] in export_safetensors.cpp); "": by the
  // extension of out_path (.pt, .pt2).
  std::string format;
  std::string like;            // safetensors: a save_pretrained folder to copy config and tokenizer files from
  std::string dtype;           // safetensors: float32, bfloat16 or float16; "": as trained
  std::string max_shard_size = "5GB";  // safetensors: save_pretrained's max_shard_size
};

struct ExportSummary {
  std::string checkpoint_dir;  // the step folder used
  std::int64_t step = 0;
  int parameters = 0;  // names set (tied names count once per name)
  int buffers = 0;
  int tied_groups = 0;  // groups checked to hold one value
  // Parameters and buffers no stage held (forward never reads them), kept
  // as they are in the model.
  std::vector<std::string> kept_unused;
};

// Every parameter and buffer of the model must be in the checkpoint, with
// the same shape and dtype, except those the split found unused (pipe.json
// "unused", recorded in the checkpoint), which keep the model's values; names in a tied group must hold the same values
// in every stage, and keep sharing one tensor in the written model. Throws
// CheckpointError or frontend::ModelError with the names at fault. The
// output is written through a temporary file and a rename.
ExportSummary exportTrainedModel(const ExportRequest& request);

// request.format == "safetensors": the checkpoint's tensors under their
// FQNs, one stage in memory at a time. Throws CheckpointError.
ExportSummary exportSafetensors(const ExportRequest& request);

}  // namespace pipeforge::train
