// What a launcher checks before any rank starts, so that a wrong config,
// split or data fails once, with its cause, and not on every rank inside a
// collective; and the split a launcher makes for its ranks. Used by the
// launchers of `pipeforge train` and `pipeforge eval` (Note [One launcher]).
#pragma once

#include <string>

#include "data/data_layout.h"
#include "stage/manifest.h"

namespace pipeforge::train {

// Shared by the launchers of a config's ranks (`pipeforge train`, `pipeforge eval`).
// Splits the configured model (model.path with its spec) into `out_dir`,
// replacing it, and returns it.
std::string splitFor(const TrainConfig& config, const std::string& out_dir);
// Stage files intact and tied groups consistent; throws ConfigError.
void checkSplitFolder(const std::string& dir, const stage::PipeManifest& manifest);
// A torch.export model takes the microbatches (and block) the config feeds;
// throws ConfigError naming the fix.
void checkInputSizes(const TrainConfig& config, const stage::PipeManifest& manifest, const DataLayout& layout);
// pipeline.output_chunks gives one entry per model output, or none (ConfigError).
void checkOutputChunks(const TrainConfig& config, const stage::PipeManifest& manifest);

class Dataset;
// Data whose rows, sequence length or dtypes the model's inputs cannot take
// is refused (ConfigError; Note [Input dtypes]).
void checkDataFitsInputs(const TrainConfig& config, const stage::PipeManifest& manifest, const DataLayout& layout,
                         Dataset& dataset);
// What the config asks of the split: input sizes and the optimizer's
// no_decay patterns; and an optimizer implementation this LibTorch has.
void checkAgainstSplit(const TrainConfig& config, const stage::PipeManifest& manifest, const DataLayout& layout);

}  // namespace pipeforge::train
