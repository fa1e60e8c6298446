// Token streams read in place: nanoGPT's .bin files (uint16 or uint32 tokens,
// no header) and plain text read as bytes (uint8 tokens, vocabulary 256).
//
// A batch row is a random window of the stream: x = tokens[i : i+T],
// y = tokens[i+1 : i+T+1], with i drawn from (seed, split, step, row) as
// nanoGPT's get_batch does with torch.randint, but the same on every rank.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "data/dataset.h"

namespace pipeforge::train {

class TokenDataset : public Dataset {
 public:
  // Maps data.path (and data.val_path). Without val_path the last
  // val_fraction of the stream is held out. Throws ConfigError when a part
  // holds fewer than block_size + 1 tokens or the size is not a whole number
  // of tokens.
  TokenDataset(const DataConfig& config, std::uint64_t seed);
  ~TokenDataset() override;

  Batch batch(DataSplit split, std::int64_t index, std::int64_t batch_size) override;
  std::string describe() const override;
  std::optional<LargestToken> largestToken() const override;

  // Number of tokens in each part.
  std::int64_t trainTokens() const;
  std::int64_t heldOutTokens() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pipeforge::train
