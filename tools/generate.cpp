#include "tools/generate.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/checkpoint.h"
#include "common/english.h"
#include "checkpoint/checkpoint_weights.h"
#include "config/train_config.h"
#include "data/sampling.h"
#include "launch/rank_launcher.h"
#include "runtime/dist_env.h"
#include "runtime/pipeline_runner.h"
#include "stage/manifest.h"
#include "stage/split_model.h"
#include "train/run_plan.h"

namespace pipeforge::train {
namespace {

namespace fs = std::filesystem;

// The draw stream of generation (Note [Seeded sampling]); training's batches
// use 0 and 1 (data/token_dataset.cpp), their orders 2 and 3.
constexpr std::uint64_t kGenerateStream = 0x67656e;  // "gen"

std::vector<std::int64_t> promptOf(const GenerateRequest& r) {
  if (r.prompt.has_value() == r.prompt_tokens.has_value()) {
    throw ConfigError("give the prompt as bytes with --prompt \"text\" or as token ids with --prompt-tokens 1,2,3 "
                      "(exactly one of them)");
  }
  std::vector<std::int64_t> out;
  if (r.prompt) {
    for (unsigned char c : *r.prompt) out.push_back(c);
  } else {
    std::string text = *r.prompt_tokens;
    std::size_t pos = 0;
    while (pos <= text.size()) {
      std::size_t comma = text.find(',', pos);
      if (comma == std::string::npos) comma = text.size();
      std::string item = text.substr(pos, comma - pos);
      item.erase(0, item.find_first_not_of(" \t"));
      item.erase(item.find_last_not_of(" \t") + 1);
      std::size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (item.empty() || used != item.size() || id < 0) {
        throw ConfigError(fmt::format("--prompt-tokens '{}': '{}' is not a token id (a non-negative integer); give "
                                      "ids separated by commas, e.g. 1,2,3",
                                      text, item));
      }
      out.push_back(id);
      pos = comma + 1;
    }
  }
  if (out.empty()) throw ConfigError("the prompt is empty; the model needs at least one token to continue");
  return out;
}

void checkOptions(const GenerateRequest& r) {
  if (r.tokens < 1) throw ConfigError(fmt::format("--tokens {}: give how many tokens to sample, >= 1", r.tokens));
  if (!std::isfinite(r.temperature) || r.temperature < 0) {
    throw ConfigError(fmt::format("--temperature {}: give a number >= 0 (0: greedy, always the most likely token)",
                                  r.temperature));
  }
  if (r.top_k < 0) throw ConfigError(fmt::format("--top-k {}: give a number >= 0 (0: every token)", r.top_k));
  checkRankCount(r.launch);
  if (r.block_size && *r.block_size < 1) {
    throw ConfigError(fmt::format("--block-size {}: give the model's maximum sequence length, >= 1", *r.block_size));
  }
  if (!(r.timeout_s > 0)) throw ConfigError(fmt::format("--timeout {}: give seconds > 0", r.timeout_s));
}

// What a .pt2's exported sizes allow (pipe.json "input_dims"; TorchScript
// models take any size): the rows of a batch (the smallest it accepts: the
// context is repeated on each, and row 0 is sampled from) and the longest
// context.
struct InputFit {
  std::int64_t rows = 1;
  std::int64_t block = 0;
};

InputFit fitInputs(const stage::PipeManifest& manifest, std::int64_t prompt_length, std::int64_t block) {
  if (manifest.inputs.size() != 1) {
    throw ConfigError(fmt::format("model '{}' takes {} inputs ({}); generate feeds one, the token ids [batch, "
                                  "sequence]",
                                  manifest.source, manifest.inputs.size(), fmt::join(manifest.inputs, ", ")));
  }
  InputFit fit{1, block};
  if (manifest.input_dims.empty() || manifest.input_dims[0].empty()) return fit;
  const auto& dims = manifest.input_dims[0];
  fit.rows = std::max<std::int64_t>(1, dims[0].min);
  if (dims[0].max >= 0 && fit.rows > dims[0].max) {
    throw ConfigError(fmt::format("model '{}' accepts no batch size in dimension 0 of '{}'", manifest.source,
                                  manifest.inputs[0]));
  }
  if (dims.size() >= 2) {
    if (dims[1].max >= 0) fit.block = std::min(fit.block, dims[1].max);
    if (std::min(prompt_length, fit.block) < dims[1].min) {
      throw ConfigError(fmt::format("model '{}' was exported for sequences of at least {} tokens in dimension 1 of "
                                    "'{}', but the prompt has {}; give a longer prompt, or export with a dynamic "
                                    "sequence dimension starting lower",
                                    manifest.source, dims[1].min, manifest.inputs[0], prompt_length));
    }
  }
  return fit;
}

std::string describeSampling(const GenerateRequest& r) {
  if (r.temperature == 0) return "greedy";
  return fmt::format("temperature {}, {}, seed {}", r.temperature,
                     r.top_k > 0 ? fmt::format("top-k {}", r.top_k) : std::string("all tokens"), r.seed);
}

// One rank of the generation.
void runRank(const GenerateRequest& r) {
  const std::vector<std::int64_t> prompt = promptOf(r);
  const RunPlan plan = planGeneration(runtime::resolveDistEnv({}), r.split_dir);
  const stage::PipeManifest& manifest = plan.manifest;
  runtime::RunnerOptions ro;
  ro.split_dir = plan.split_dir;
  ro.manifest = plan.manifest;
  ro.dist = plan.env;
  ro.schedule = plan.program;
  ro.num_microbatches = plan.program.num_microbatches;
  ro.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(r.timeout_s * 1000));
  runtime::PipelineRunner runner(ro);
  loadRunnerWeights(runner, r.checkpoint);
  const InputFit fit = fitInputs(manifest, static_cast<std::int64_t>(prompt.size()), r.block_size.value_or(0));

  // Logits of the context's last position, on the rank holding the last stage.
  auto forward = [&](const std::vector<std::int64_t>& context, at::Tensor* shape_out) {
    at::Tensor row = at::tensor(at::ArrayRef<std::int64_t>(context), at::kLong).unsqueeze(0);
    runtime::EvalResult result = runner.evalStep({row.expand({fit.rows, row.size(1)}).contiguous()});
    if (!runner.computesLoss()) return at::Tensor();
    const at::Tensor& out = result.outputs.at(0);
    if (shape_out != nullptr) *shape_out = out;
    return out.dim() == 3 ? out[0][out.size(1) - 1].to(at::kDouble).contiguous() : at::Tensor();
  };

  // The vocabulary, from the logits of a context of zeros (a valid token of
  // any model): a prompt token outside it is refused by every rank alike,
  // before it reaches an embedding lookup.
  std::vector<std::int64_t> probe(static_cast<std::size_t>(std::min<std::int64_t>(prompt.size(), fit.block)), 0);
  constexpr int kMaxDims = 8;
  at::Tensor shape = at::zeros({1 + kMaxDims}, at::kDouble);  // ndim, sizes[0..kMaxDims)
  {
    at::Tensor out;
    forward(probe, &out);
    if (out.defined()) {
      auto s = shape.accessor<double, 1>();
      s[0] = static_cast<double>(out.dim());
      for (int d = 0; d < std::min<int>(kMaxDims, out.dim()); ++d) s[d + 1] = static_cast<double>(out.size(d));
    }
  }
  runner.allreduceSumAll(shape);
  auto s = shape.accessor<double, 1>();
  const auto ndim = static_cast<std::int64_t>(s[0]);
  const auto vocab = static_cast<std::int64_t>(s[3]);
  if (ndim != 3 || static_cast<std::int64_t>(s[1]) != fit.rows ||
      static_cast<std::int64_t>(s[2]) != static_cast<std::int64_t>(probe.size()) || vocab < 1) {
    std::vector<std::int64_t> sizes;
    for (std::int64_t d = 0; d < std::min<std::int64_t>(ndim, kMaxDims); ++d) {
      sizes.push_back(static_cast<std::int64_t>(s[d + 1]));
    }
    throw ConfigError(fmt::format("the first output of model '{}' has {} (sizes [{}]{}) for {} row(s) of {} tokens; "
                                  "generate needs logits [batch, sequence, vocabulary]",
                                  manifest.source, counted(ndim, "dimension"), fmt::join(sizes, ", "),
                                  ndim > kMaxDims ? ", ..." : "", fit.rows, probe.size()));
  }
  if (r.prompt && vocab > 256) {
    throw ConfigError(fmt::format("the model's vocabulary has {} tokens (its logits' last dimension), more than the "
                                  "256 byte values; --prompt suits a byte-level model (data.format: text): give token "
                                  "ids with --prompt-tokens",
                                  vocab));
  }
  for (std::size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < vocab) continue;
    if (r.prompt) {
      throw ConfigError(fmt::format("--prompt byte {} (offset {}) is outside the model's vocabulary of {} tokens (its "
                                    "logits' last dimension); give token ids below {} with --prompt-tokens",
                                    prompt[i], i, vocab, vocab));
    }
    throw ConfigError(fmt::format("--prompt-tokens: id {} (position {}) is outside the model's vocabulary of {} "
                                  "tokens (its logits' last dimension); give ids below {}",
                                  prompt[i], i, vocab, vocab));
  }

  std::vector<std::int64_t> all = prompt;
  for (std::int64_t k = 0; k < r.tokens; ++k) {
    // The context: the last `block` tokens, the most the model can take.
    const auto length = std::min<std::int64_t>(static_cast<std::int64_t>(all.size()), fit.block);
    std::vector<std::int64_t> context(all.end() - length, all.end());
    at::Tensor logits = forward(context, nullptr);
    at::Tensor token = at::zeros({1}, at::kDouble);
    if (logits.defined()) {
      std::vector<double> values(logits.data_ptr<double>(), logits.data_ptr<double>() + logits.numel());
      token.fill_(static_cast<double>(sampleToken(values, r.temperature, r.top_k, r.seed, k)));
    }
    runner.allreduceSumAll(token);  // only the last rank's is non-zero
    all.push_back(static_cast<std::int64_t>(token.item<double>()));
  }
  if (runner.rank() != 0) return;
  const std::vector<std::int64_t> continuation(all.begin() + static_cast<std::ptrdiff_t>(prompt.size()), all.end());
  const CheckpointMeta meta = readCheckpointMeta(r.checkpoint);
  std::cout << fmt::format("pipeforge generate: {} tokens from step {} of {} on {} rank{}, {}, block size {}\n",
                           r.tokens, meta.step, r.checkpoint, plan.env.world_size, plan.env.world_size == 1 ? "" : "s",
                           describeSampling(r), fit.block);
  if (r.prompt) {
    std::cout << "prompt:       \"" << escapeBytes(prompt) << "\"\n"
              << "continuation: \"" << escapeBytes(continuation) << "\"\n";
  } else {
    std::cout << fmt::format("prompt:       [{}]\ncontinuation: [{}]\n", fmt::join(prompt, ", "),
                             fmt::join(continuation, ", "));
  }
  std::cout << std::flush;
}

void launch(const GenerateRequest& r) {
  const std::vector<std::int64_t> prompt = promptOf(r);
  const std::string step_dir = fs::absolute(resolveCheckpoint(r.checkpoint)).string();
  verifyCheckpoint(step_dir);
  const CheckpointMeta meta = readCheckpointMeta(step_dir);

  // Note [Block size]: the longest context is never a guess. In order:
  // --block-size; the length the run trained on (checkpoint meta.json
  // "block_size", recorded from data.block_size), since positions it never
  // saw are untrained; the rows of a position embedding (a position past
  // them fails inside a stage); the largest sequence a torch.export model
  // was exported for (its dynamic dimension 1). A position embedding caps
  // every choice. The one used is printed with where it came from.
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> shapes;
  for (const auto& [name, t] : readCheckpointTensors(step_dir, meta.num_stages, /*parameters=*/true)) {
    shapes.emplace_back(name, t.tensor.sizes().vec());
  }
  const std::optional<std::int64_t> rows = positionEmbeddingRows(shapes);
  if (r.block_size && rows && *r.block_size > *rows) {
    throw ConfigError(fmt::format("--block-size {} is longer than the model's position embedding ({} positions); "
                                  "give --block-size {} or less",
                                  *r.block_size, *rows, *rows));
  }

  const int nproc = r.launch.nproc > 0 ? r.launch.nproc : meta.num_stages;
  ScratchDir scratch("pipeforge-generate-");
  const std::string spec = scratch.path() + "/split.yaml";
  std::ofstream(spec) << fmt::format("num_stages: {}\npolicy: parameters\n", nproc);
  stage::SplitRequest split;
  split.model_path = r.model_path;
  split.spec_path = spec;
  split.out_dir = scratch.path() + "/stages";
  stage::splitModelToDirectory(split);
  const stage::PipeManifest manifest = stage::readManifest(split.out_dir);
  if (manifest.num_stages != nproc) {
    throw ConfigError(fmt::format("model '{}' split into {} stages, not the {} of --nproc (its pipe_split() markers "
                                  "add cuts); give --nproc {}",
                                  r.model_path, manifest.num_stages, nproc, manifest.num_stages));
  }
  std::int64_t block = 0;
  std::string block_from;
  const bool exported_sequence = !manifest.input_dims.empty() && manifest.input_dims[0].size() >= 2 &&
                                 manifest.input_dims[0][1].max >= 0;
  if (r.block_size) {
    block = *r.block_size;
    block_from = "--block-size";
  } else if (meta.block_size) {
    block = rows ? std::min(*meta.block_size, *rows) : *meta.block_size;
    block_from = "the run's data.block_size";
  } else if (rows) {
    block = *rows;
    block_from = "the model's position embedding";
  } else if (exported_sequence) {
    block = manifest.input_dims[0][1].max;
    block_from = "the longest sequence the model was exported for";
  } else {
    throw ConfigError(fmt::format("cannot tell the maximum sequence length of the model trained in '{}': the run "
                                  "recorded none (tensor data), it has no position embedding (wpe.weight, pos_emb, "
                                  "...) and no dynamic sequence dimension; give it with --block-size N",
                                  step_dir));
  }
  if (exported_sequence && block > manifest.input_dims[0][1].max) {
    const std::int64_t longest = manifest.input_dims[0][1].max;
    if (r.block_size) {
      throw ConfigError(fmt::format("--block-size {} is longer than the longest sequence model '{}' was exported for "
                                    "({} tokens in dimension 1 of '{}'); give --block-size {} or less, or re-export "
                                    "with a larger max (torch.export.Dim(\"seq\", max=...))",
                                    *r.block_size, r.model_path, longest, manifest.inputs[0], longest));
    }
    block = longest;
    block_from += ", capped at the longest sequence the model was exported for";
  }
  fitInputs(manifest, static_cast<std::int64_t>(prompt.size()), block);  // refuses here, once, not on every rank
  std::cout << fmt::format("context: at most {} tokens ({})\n", block, block_from) << std::flush;

  RankCommand ranks;
  ranks.args = {"generate", step_dir, "--model", r.model_path};
  // One argument each, so a prompt starting with '-' stays a value.
  ranks.args.push_back(r.prompt ? "--prompt=" + *r.prompt : "--prompt-tokens=" + *r.prompt_tokens);
  ranks.args.insert(ranks.args.end(),
                      {"--tokens", std::to_string(r.tokens), "--temperature", fmt::format("{:.17g}", r.temperature),
                       "--top-k", std::to_string(r.top_k), "--seed", std::to_string(r.seed), "--block-size",
                       std::to_string(block), "--timeout", fmt::format("{:.17g}", r.timeout_s), "--split-dir",
                       split.out_dir});
  ranks.num_ranks = nproc;
  std::cout << runRanksForOutput(r.launch, ranks) << std::flush;
}

}  // namespace

void runGenerateRequest(const GenerateRequest& request) {
  checkOptions(request);
  if (request.split_dir.empty()) return launch(request);
  try {
    runRank(request);
  } catch (...) {
    const runtime::DistEnv env = runtime::resolveDistEnv({});
    rethrowWithContext(fmt::format("rank {}", env.rank));  // keeps the error's code
  }
}

std::int64_t sampleToken(const std::vector<double>& logits, double temperature, std::int64_t top_k,
                         std::uint64_t seed, std::int64_t index) {
  if (logits.empty()) throw std::invalid_argument("sampleToken: no logits");
  const auto n = static_cast<std::int64_t>(logits.size());
  if (temperature == 0) {
    return static_cast<std::int64_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  std::vector<std::int64_t> kept(logits.size());
  std::iota(kept.begin(), kept.end(), 0);
  if (top_k > 0 && top_k < n) {
    std::stable_sort(kept.begin(), kept.end(), [&](std::int64_t a, std::int64_t b) { return logits[a] > logits[b]; });
    kept.resize(static_cast<std::size_t>(top_k));
    std::sort(kept.begin(), kept.end());
  }
  double peak = -INFINITY;
  for (std::int64_t i : kept) peak = std::max(peak, logits[i]);
  std::vector<double> weight;
  double total = 0.0;
  for (std::int64_t i : kept) {
    weight.push_back(std::exp((logits[i] - peak) / temperature));
    total += weight.back();
  }
  const double u =
      static_cast<double>(drawBits(seed, kGenerateStream, static_cast<std::uint64_t>(index), 0) >> 11) * 0x1p-53;
  double cumulative = 0.0;
  for (std::size_t j = 0; j < kept.size(); ++j) {
    cumulative += weight[j] / total;
    if (u < cumulative) return kept[j];
  }
  return kept.back();  // u within rounding of 1
}

std::optional<std::int64_t> positionEmbeddingRows(
    const std::vector<std::pair<std::string, std::vector<std::int64_t>>>& shapes) {
  static const char* const kNames[] = {"wpe",          "pos_emb",       "pos_embedding",       "position_embedding",
                                       "position_embeddings", "positional_embedding", "embed_positions", "pos_embed"};
  std::optional<std::int64_t> rows;
  std::string from;
  for (const auto& [name, sizes] : shapes) {
    std::string module = name;
    const std::string suffix = ".weight";
    if (module.size() > suffix.size() && module.compare(module.size() - suffix.size(), suffix.size(), suffix) == 0) {
      module.resize(module.size() - suffix.size());
    }
    const std::string last = module.substr(module.rfind('.') == std::string::npos ? 0 : module.rfind('.') + 1);
    if (std::find_if(std::begin(kNames), std::end(kNames), [&](const char* k) { return last == k; }) ==
        std::end(kNames)) {
      continue;
    }
    std::int64_t here = 0;
    if (sizes.size() == 2) {
      here = sizes[0];
    } else if (sizes.size() == 3 && sizes[0] == 1) {
      here = sizes[1];
    } else {
      continue;
    }
    if (rows && *rows != here) {
      throw ConfigError(fmt::format("the position embeddings '{}' ({} positions) and '{}' ({}) disagree; give the "
                                    "model's maximum sequence length with --block-size N",
                                    from, *rows, name, here));
    }
    rows = here;
    from = name;
  }
  return rows;
}

std::string escapeBytes(const std::vector<std::int64_t>& bytes) {
  std::string out;
  for (std::int64_t b : bytes) {
    switch (b) {
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (b >= 0x20 && b < 0x7f) {
          out += static_cast<char>(b);
        } else {
          out += fmt::format("\\x{:02x}", b & 0xff);
        }
    }
  }
  return out;
}

}  // namespace pipeforge::train
