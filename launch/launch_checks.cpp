#include "launch/launch_checks.h"

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/script.h>
#include "checkpoint/checkpoint.h"
#include "common/error.h"
#include "common/interrupt.h"
#include "config/train_config.h"
#include "data/dataset.h"
#include "data/open_dataset.h"
#include "frontend/load_model.h"
#include "frontend/pt2_import.h"
#include "launch/device_check.h"
#include "partitioner/split_spec.h"
#include "runtime/dist_env.h"
#include "runtime/local_launcher.h"
#include "stage/file_digest.h"
#include "stage/manifest.h"
#include "stage/split_model.h"
#include "stage/value_meta.h"
#include "train/optimizer_factory.h"
#include "train/trainer.h"

namespace pipeforge::train {

namespace fs = std::filesystem;

std::string splitFor(const TrainConfig& config, const std::string& out_dir) {
  std::error_code ec;
  fs::create_directories(fs::path(out_dir).parent_path(), ec);
  stage::SplitRequest request;
  request.model_path = config.model.path;
  request.out_dir = out_dir;
  request.force = true;
  request.spec = config.model.spec;  // parsed with the config (its file's lines in errors)
  request.weights = config.model.weights;
  request.accept_unused_weights = config.model.accept_unused_weights;
  try {
    stage::splitModelToDirectory(request);
  } catch (const partitioner::SpecError& e) {
    // What only the model can check (split point names, constant_inputs' types).
    throw ConfigError(config.model.split_spec.empty() ? fmt::format("{} (under model: in {})", e.what(), config.origin)
                                                      : fmt::format("{}: model.split_spec: {}", config.origin, e.what()));
  }
  return out_dir;
}

// Before any rank starts: every stage file is intact (Note [File digests]) and
// every tied group names tensors of one shape and dtype, so a hand-edited or
// damaged split folder fails here with its cause, not inside a collective.
// The shapes come from pipe.json's parameter_meta, written with the stage
// files the digests vouch for, so no stage file is loaded into this process
// (issue 25: the launcher held the whole model); a manifest written before
// parameter_meta has its stage files loaded, as before.
void checkSplitFolder(const std::string& dir, const stage::PipeManifest& manifest) {
  std::map<std::string, std::pair<int, std::string>> params;  // FQN -> (stage, "float32[64, 16]")
  for (const stage::StageInfo& info : manifest.stages) {
    stage::verifyStageFile(dir, info);
    if (info.parameter_meta.size() == info.parameters.size()) {
      for (std::size_t k = 0; k < info.parameters.size(); ++k) {
        params.emplace(info.parameters[k], std::make_pair(info.index, info.parameter_meta[k]));
      }
      continue;
    }
    torch::jit::Module module;
    try {
      module = std::filesystem::path(info.file).extension() == ".pt2" ? frontend::loadPt2Model(dir + "/" + info.file)
                                                              : torch::jit::load(dir + "/" + info.file, c10::Device(c10::kCPU));
    } catch (const c10::Error& e) {
      throw ConfigError(fmt::format("stage {}: cannot load '{}/{}' ({}); re-run `pipeforge split`", info.index, dir,
                                    info.file, e.what_without_backtrace()));
    } catch (const frontend::ModelError& e) {
      throw ConfigError(fmt::format("stage {}: cannot load '{}/{}' ({}); re-run `pipeforge split`", info.index, dir,
                                    info.file, e.what()));
    }
    for (const auto& p : module.named_parameters(true)) {
      params.emplace(p.name, std::make_pair(info.index, stage::tensorMeta(p.value)));
    }
  }
  for (const auto& group : manifest.tied) {
    // A name of the group that no stage reads under that name (BERT's
    // cls.predictions.bias, read as cls.predictions.decoder.bias) is the same
    // tensor as the held ones; a group none of whose names is held is not.
    if (std::none_of(group.begin(), group.end(), [&](const std::string& fqn) { return params.count(fqn) > 0; })) {
      throw ConfigError(fmt::format("{}/pipe.json: tied group [{}] names tensors no stage file holds; the split "
                                    "folder is inconsistent: re-run `pipeforge split`",
                                    dir, fmt::join(group, ", ")));
    }
    const std::pair<int, std::string>* first = nullptr;
    for (const std::string& fqn : group) {
      auto it = params.find(fqn);
      if (it == params.end()) continue;
      if (first == nullptr) {
        first = &it->second;
        continue;
      }
      const std::string& a = first->second;
      const std::string& b = it->second.second;
      if (a != b) {
        throw ConfigError(fmt::format("{}/pipe.json: tied group [{}] joins '{}' ({} in stage {}) and '{}' ({} in stage "
                                      "{}), which cannot be one tensor; the split folder is inconsistent: re-run "
                                      "`pipeforge split`",
                                      dir, fmt::join(group, ", "), group.front(), a, first->first, fqn, b,
                                      it->second.first));
      }
    }
  }
}

// A torch.export model takes only the sizes it was exported with, except in
// dimensions made dynamic (pipe.json "input_dims"). Each stage receives one
// microbatch, so its rows must fit dimension 0 of every input, and token data
// must fit the sequence dimension; refused here, before any rank starts,
// rather than failing (or worse) inside a stage.
void checkInputSizes(const TrainConfig& config, const stage::PipeManifest& manifest, const DataLayout& layout) {
  if (manifest.input_dims.empty()) return;
  const std::int64_t rows = replicaBatchSize(config) / config.pipeline.microbatches;
  auto accepts = [](const stage::InputDim& d, std::int64_t n) { return n >= d.min && (d.max < 0 || n <= d.max); };
  auto describe = [](const stage::InputDim& d) {
    if (d.min == d.max) return fmt::format("a static size of {}", d.min);
    return d.max < 0 ? fmt::format("sizes >= {}", d.min) : fmt::format("sizes {}..{}", d.min, d.max);
  };
  // The batch dim of each input: dim 0, or its pipeline.input_chunks dim; a
  // replicated input has none (Note [Input chunks] in data/data_layout.h).
  const std::vector<ChunkEntry>& chunks = layout.inputs;
  for (size_t i = 0; i < manifest.input_dims.size(); ++i) {
    const auto& dims = manifest.input_dims[i];
    const std::string& name = manifest.inputs.at(i);
    const ChunkEntry chunk = i < chunks.size() ? chunks[i] : ChunkEntry{};
    if (chunk.replicate) continue;
    const auto b = static_cast<std::size_t>(chunk.dim);
    if (dims.size() > b && !accepts(dims[b], rows)) {
      const stage::InputDim& d = dims[b];
      const std::int64_t per_row = config.pipeline.microbatches * config.pipeline.data_parallel;
      const std::string fed = fmt::format(
          "training feeds microbatches of {} rows (training.global_batch_size {} / pipeline.data_parallel {} / "
          "pipeline.microbatches {})",
          rows, config.global_batch_size, config.pipeline.data_parallel, config.pipeline.microbatches);
      if (d.min == d.max) {
        throw ConfigError(fmt::format(
            "model '{}' was exported with {} in dimension {} (the batch) of input '{}', but {}; re-export with a "
            "dynamic batch, torch.export.export(..., dynamic_shapes={{\"{}\": {{{}: torch.export.Dim(\"batch\")}}}}), "
            "or set training.global_batch_size to {}",
            manifest.source, describe(d), b, name, fed, name, b, d.min * per_row));
      }
      if (rows < d.min) {
        throw ConfigError(fmt::format(
            "model '{}' was exported with {} in dimension {} (the batch) of input '{}', but {}; set "
            "training.global_batch_size to at least {} ({} rows per microbatch), or lower pipeline.microbatches",
            manifest.source, describe(d), b, name, fed, d.min * per_row, d.min));
      }
      // Above the export's maximum (torch.export.Dim("batch", max=N) caps it).
      throw ConfigError(fmt::format(
          "model '{}' was exported with {} in dimension {} (the batch) of input '{}': the export caps a microbatch "
          "at {} rows (torch.export.Dim(..., max={})), but {}; set training.global_batch_size to at most {} ({} rows "
          "per microbatch), or re-export with a larger max",
          manifest.source, describe(d), b, name, d.max, d.max, fed, d.max * per_row, d.max));
    }
    if (config.data.format != DataFormat::kTensors && i == 0 && dims.size() >= 2 &&
        !accepts(dims[1], config.data.block_size)) {
      const stage::InputDim& d = dims[1];
      std::string fix;
      if (d.min == d.max) {
        fix = fmt::format("set data.block_size to {}, or re-export with that dimension dynamic, "
                          "torch.export.export(..., dynamic_shapes={{\"{}\": {{1: torch.export.Dim(\"seq\")}}}})",
                          d.min, name);
      } else if (config.data.block_size < d.min) {
        fix = fmt::format("set data.block_size to at least {}", d.min);
      } else {
        fix = fmt::format("the export caps the sequence at {} tokens (torch.export.Dim(\"seq\", max={})): set "
                          "data.block_size to at most {}, or re-export with a larger max",
                          d.max, d.max, d.max);
      }
      throw ConfigError(fmt::format("model '{}' was exported with {} in dimension 1 (the sequence) of input '{}', but "
                                    "data.block_size is {}; {}",
                                    manifest.source, describe(d), name, config.data.block_size, fix));
    }
  }
}

// A microbatch of the data against every dimension the export fixed or
// bounded (pipe.json "input_dims"), not only the batch: a program exported
// for 16 tokens fails inside a stage's first reshape on 24, with a message
// about expanded sizes that names neither the data nor the export.
// Note [Input dtypes]: data whose kind differs from what an input takes
// (float64 for float32, floats for token ids) would fail inside a stage's
// forward on every rank; pipe.json's dtypes (a .pt2's declared ones, a
// TorchScript split's example inputs) let the launcher refuse it first. Integer widths may differ (an embedding takes int32 or int64 ids);
// floating dtypes must match, since the forward does not convert them.
void checkDataDtypes(const TrainConfig& config, const stage::PipeManifest& manifest, const Batch& one) {
  for (size_t i = 0; i < manifest.inputs.size() && i < one.inputs.size(); ++i) {
    const std::string takes = stage::inputDtype(manifest, i);
    if (takes.empty()) continue;
    const at::ScalarType given = one.inputs[i].scalar_type();
    const std::string given_name = stage::canonicalDtypeName(c10::toString(given));
    const bool both_integers = c10::isIntegralType(given, false) && (takes == "int64" || takes == "int32");
    if (given_name == takes || both_integers) continue;
    const std::string where = config.data.format == DataFormat::kTensors
                                  ? fmt::format("data: inputs[{}] ({})", i, config.data.path)
                                  : fmt::format("data ({})", config.data.path);
    throw ConfigError(fmt::format("{} is {}; the model's input '{}' takes {}; convert the data (torch.save the "
                                  "tensor .to(torch.{})), or split a model that takes {}",
                                  where, given_name, manifest.inputs.at(i), takes, takes, given_name));
  }
}

// Token ids against the embedding the first input indexes (pipe.json
// "input_embeddings"): an id past its rows fails inside stage 0's forward,
// on its first step, as "index out of range in self". The usual cause is a
// text file read as data.format: tokens (bytes paired into uint16 ids).
void checkTokenIds(const TrainConfig& config, const stage::PipeManifest& manifest, const Dataset& dataset) {
  if (config.data.format == DataFormat::kTensors || manifest.input_embeddings.empty()) return;
  const stage::InputEmbedding& embedding = manifest.input_embeddings.front();
  if (embedding.module.empty()) return;
  const std::optional<Dataset::LargestToken> largest = dataset.largestToken();
  if (!largest || largest->id < embedding.rows) return;
  std::string fix;
  if (config.data.format == DataFormat::kText) {
    fix = fmt::format("data.format: text feeds each byte as an id (0..255), which needs an embedding of at least 256 "
                      "rows; train a byte-level model, or tokenize the text into ids below {} (data.format: tokens)",
                      embedding.rows);
  } else if (embedding.rows >= 256) {
    fix = fmt::format("if '{}' is text, set data.format: text (its bytes are the ids); else tokenize it for this "
                      "model's vocabulary (ids below {}) and check data.dtype",
                      largest->file, embedding.rows);
  } else {
    fix = fmt::format("tokenize the data for this model's vocabulary (ids below {}) and check data.dtype",
                      embedding.rows);
  }
  throw ConfigError(fmt::format("{} '{}' holds token id {} (at token {}, read as data.format: {}), but the model's "
                                "input '{}' indexes embedding '{}', which has {} rows (ids 0..{}); {}",
                                largest->file == config.data.val_path ? "data.val_path" : "data.path", largest->file,
                                largest->id, largest->position,
                                config.data.format == DataFormat::kText ? "text" : "tokens", manifest.inputs.at(0),
                                embedding.module, embedding.rows, embedding.rows - 1, fix));
}

void checkDataFitsInputs(const TrainConfig& config, const stage::PipeManifest& manifest, const DataLayout& layout,
                         Dataset& dataset) {
  checkTokenIds(config, manifest, dataset);
  if (manifest.input_dims.empty() && manifest.input_dtypes.empty() && manifest.input_meta.empty()) return;
  const std::int64_t rows = replicaBatchSize(config) / config.pipeline.microbatches;
  if (rows < 1) return;  // refused with its own message by checkInputSizes
  const Batch one = sliceBatch(dataset.batch(DataSplit::kTrain, 0, rows), 0, rows, layout);
  checkDataDtypes(config, manifest, one);
  const std::vector<ChunkEntry>& chunks = layout.inputs;
  for (size_t i = 0; i < manifest.input_dims.size() && i < one.inputs.size(); ++i) {
    const auto& dims = manifest.input_dims[i];
    const at::Tensor& x = one.inputs[i];
    const std::string& name = manifest.inputs.at(i);
    if (dims.empty()) continue;
    if (static_cast<size_t>(x.dim()) != dims.size()) {
      throw ConfigError(fmt::format("model '{}' takes input '{}' with {} dimensions, but the data gives it {} "
                                    "(sizes {}); check data.path's inputs and their order ({})",
                                    manifest.source, name, dims.size(), x.dim(), x.sizes(),
                                    fmt::join(manifest.inputs, ", ")));
    }
    const ChunkEntry chunk = i < chunks.size() ? chunks[i] : ChunkEntry{};
    for (size_t d = 0; d < dims.size(); ++d) {
      if (!chunk.replicate && static_cast<int>(d) == chunk.dim) continue;  // the batch: checkInputSizes
      const std::int64_t n = x.size(static_cast<std::int64_t>(d));
      // Note [Variable sequence lengths]: with packing none a microbatch
      // runs at any length from 2 to block_size along the sequence.
      const bool varies = config.data.format != DataFormat::kTensors && config.data.packing == Packing::kNone && d == 1;
      const std::int64_t shortest = varies ? std::min<std::int64_t>(2, n) : n;
      if (shortest >= dims[d].min && (dims[d].max < 0 || n <= dims[d].max)) continue;
      const std::string exported = dims[d].min == dims[d].max ? fmt::format("a static size of {}", dims[d].min)
                                   : dims[d].max < 0            ? fmt::format("sizes >= {}", dims[d].min)
                                                                : fmt::format("sizes {}..{}", dims[d].min, dims[d].max);
      const std::string data = varies ? fmt::format("data.packing: none runs each microbatch at its own length, "
                                                    "from 2 to data.block_size {}",
                                                    config.data.block_size)
                               : config.data.format != DataFormat::kTensors
                                   ? fmt::format("data.block_size is {}", config.data.block_size)
                                   : fmt::format("the data's microbatches have {} there", n);
      throw ConfigError(fmt::format(
          "model '{}' was exported with {} in dimension {} of input '{}', but {}; re-export with that dimension "
          "dynamic, torch.export.export(..., dynamic_shapes={{\"{}\": {{{}: torch.export.Dim(\"{}\")}}}}), or "
          "make the data fit",
          manifest.source, exported, d, name, data, name, d, d == 1 ? "seq" : "dim"));
    }
  }
}

// A no_decay glob that matches no parameter is a typo, not a choice. Globs
// are matched against the names PyTorch's named_parameters() lists: a tied
// group by its first name (Note [No-decay groups]).
void checkNoDecayPatterns(const TrainConfig& config, const stage::PipeManifest& manifest) {
  std::map<std::string, std::string> first_name;
  for (const auto& group : manifest.tied) {
    for (const auto& name : group) first_name[name] = group.front();
  }
  std::set<std::string> names, other_names;
  for (const auto& stage : manifest.stages) {
    for (const auto& name : stage.parameters) {
      auto it = first_name.find(name);
      names.insert(it == first_name.end() ? name : it->second);
      if (it != first_name.end() && it->second != name) other_names.insert(name);
    }
  }
  for (const auto& pattern : config.optimizer.no_decay) {
    OptimizerConfig one;
    one.no_decay = {pattern};
    if (std::any_of(names.begin(), names.end(), [&](const std::string& n) { return matchesNoDecay(one, n); })) {
      continue;
    }
    for (const auto& name : other_names) {
      if (matchesNoDecay(one, name)) {
        throw ConfigError(fmt::format("{}: optimizer.no_decay pattern '{}' matches only '{}', a tied name of '{}'; "
                                      "a tied weight is matched by its first name, as PyTorch's named_parameters() "
                                      "lists it: use '{}'",
                                      config.origin, pattern, name, first_name.at(name), first_name.at(name)));
      }
    }
    std::vector<std::string> some(names.begin(), std::next(names.begin(), std::min<std::size_t>(names.size(), 4)));
    throw ConfigError(fmt::format("{}: optimizer.no_decay pattern '{}' matches no parameter of the model (names look "
                                  "like {}); fix the glob (`*` matches any text, dots included)",
                                  config.origin, pattern, fmt::join(some, ", ")));
  }
}

void checkOutputChunks(const TrainConfig& config, const stage::PipeManifest& manifest) {
  const auto& chunks = config.pipeline.output_chunks;
  if (chunks.empty() || chunks.size() == manifest.outputs.size()) return;
  throw ConfigError(fmt::format("{}: pipeline.output_chunks gives {} entries but model '{}' has {} outputs; give one "
                                "per output, in order (an integer dim or replicate)",
                                chunks.front().where, chunks.size(), manifest.source, manifest.outputs.size()));
}

// What the config asks of the split, checked once before any rank starts.
void checkAgainstSplit(const TrainConfig& config, const stage::PipeManifest& manifest, const DataLayout& layout) {
  checkInputSizes(config, manifest, layout);
  checkOutputChunks(config, manifest);
  checkNoDecayPatterns(config, manifest);
  checkOptimizerAvailable(config.optimizer);
}

}  // namespace pipeforge::train
