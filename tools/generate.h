// `pipeforge generate`: sample tokens from a trained language model, its
// stages pipelined over local ranks.
//
// The launcher resolves the checkpoint, finds the model's block size, splits
// the model into P stages (parameters policy) in a scratch folder and
// re-runs itself as P ranks. Each rank loads its stages' weights from the
// checkpoint by FQN (checkpoint/checkpoint_weights.h), then, per new token, runs
// one forward of the context through the pipeline (PipelineRunner::evalStep);
// the last rank samples from the last position's logits and every rank
// learns the token from a sum over all ranks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "launch/rank_launcher.h"
namespace pipeforge::train {

struct GenerateRequest {
  std::string checkpoint;  // CKPT (its `latest`) or CKPT/step_<N>
  std::string model_path;  // the model the run was trained from
  std::optional<std::string> prompt;         // bytes: one token per byte (byte-level LMs)
  std::optional<std::string> prompt_tokens;  // token ids, "1,2,3"
  std::int64_t tokens = 0;                   // how many to sample
  double temperature = 1.0;                  // 0: greedy (argmax)
  std::int64_t top_k = 0;                    // 0: every token
  std::uint64_t seed = 1;
  RankLaunch launch;                         // nproc 0: the checkpoint's stage count
  std::optional<std::int64_t> block_size;    // default: the position embedding's rows
  double timeout_s = 120.0;                  // bound on every wait for a peer
  std::string split_dir;  // set by the launcher for its ranks: the split to load
};

// Runs the request: as the launcher (split_dir empty) or as one of its ranks.
// Rank 0 prints the prompt and the continuation:
//   prompt:       "Once upon"
//   continuation: " a time\n"
// (bytes as C-escaped text: printable ASCII as is, \\, \", \n, \t, \r, and
// \xNN for every other byte), or token ids as [1, 2, 3] with --prompt-tokens.
// Throws pipeforge::Error: ConfigError / CheckpointError (bad options, a
// prompt the model cannot take), runtime errors, each with its code, for the
// CLI to report.
void runGenerateRequest(const GenerateRequest& request);

// Note [Seeded sampling]: token `index` of a generation is drawn from
// logits / temperature, restricted to the top_k largest logits (ties at the
// boundary: the lower token ids), with u = drawBits(seed, kGenerateStream,
// index, 0) as a uniform in [0, 1) walking the cumulative probabilities in
// token-id order. No generator state: the same (logits, options, seed,
// index) give the same token on any rank, torch version or machine.
// temperature 0 takes the first largest logit.
std::int64_t sampleToken(const std::vector<double>& logits, double temperature, std::int64_t top_k,
                         std::uint64_t seed, std::int64_t index);

// The model's maximum sequence length, read from a position embedding among
// `shapes` (parameter FQN -> sizes): a parameter named <m>.weight or <m> for
// m in wpe, pos_emb, pos_embedding, position_embedding(s),
// positional_embedding, embed_positions, pos_embed, with rows [T, C] or
// [1, T, C]. nullopt when there is none; throws ConfigError when several
// disagree.
std::optional<std::int64_t> positionEmbeddingRows(
    const std::vector<std::pair<std::string, std::vector<std::int64_t>>>& shapes);

// The C-escaped text of bytes (see runGenerateRequest).
std::string escapeBytes(const std::vector<std::int64_t>& bytes);

}  // namespace pipeforge::train
