// The whole split: model + spec -> stage modules + manifest, in memory or on disk.
#pragma once

#include <optional>
#include <string>

#include "stage/manifest.h"

namespace pipeforge::stage {

struct SplitRequest {
  std::string model_path;
  std::optional<std::string> spec_path;  // optional when forward has pipe_split() markers
  std::string out_dir;
  bool force = false;  // replace an existing out_dir
};

struct SplitSummary {
  PipeManifest manifest;
  std::string balance;  // what an automatic policy reached; empty otherwise
};

// Loads, splits and writes DIR/stage_<i>.pt and DIR/pipe.json atomically:
// everything is written to a temporary sibling folder and renamed into place,
// so a failed split leaves no partial output.
SplitSummary splitModelToDirectory(const SplitRequest& request);

}  // namespace pipeforge::stage
