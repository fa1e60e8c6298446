// Deterministic random draws keyed by (seed, stream, step, slot): no state,
// so every rank draws the same batch and a resumed run draws what an
// uninterrupted one would have (Note [Stateless sampling]).
//
// Note [Stateless sampling]: the data position of a run is its step count.
// Nothing about the data needs saving in a checkpoint beyond the step, and
// ranks never exchange indices: each computes the same global batch.
#pragma once

#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

namespace pipeforge::train {

// SplitMix64's finaliser: a bijection on 64 bits with good avalanche.
inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A 64-bit value determined by its four keys.
inline std::uint64_t drawBits(std::uint64_t seed, std::uint64_t stream, std::uint64_t step, std::uint64_t slot) {
  return mix64(mix64(mix64(mix64(seed) ^ stream) ^ step) ^ slot);
}

// Uniform in [0, bound) (bound > 0), by Lemire's multiply-shift; the bias is
// below bound / 2^64, far under anything a batch can show.
inline std::uint64_t drawBelow(std::uint64_t bits, std::uint64_t bound) {
  return static_cast<std::uint64_t>((static_cast<unsigned __int128>(bits) * bound) >> 64);
}

// The order of one epoch of n items (rows, documents): a Fisher-Yates
// shuffle drawn from (seed, stream, epoch), kept until another is asked for.
class EpochOrder {
 public:
  const std::vector<std::int64_t>& get(std::uint64_t seed, std::uint64_t stream, std::int64_t epoch, std::int64_t n) {
    if (stream_ == stream && epoch_ == epoch && static_cast<std::int64_t>(order_.size()) == n) return order_;
    order_.resize(static_cast<std::size_t>(n));
    std::iota(order_.begin(), order_.end(), 0);
    for (std::int64_t i = n - 1; i > 0; --i) {
      const auto j = static_cast<std::int64_t>(
          drawBelow(drawBits(seed, stream, static_cast<std::uint64_t>(epoch), static_cast<std::uint64_t>(i)),
                    static_cast<std::uint64_t>(i + 1)));
      std::swap(order_[i], order_[j]);
    }
    stream_ = stream;
    epoch_ = epoch;
    return order_;
  }

 private:
  std::uint64_t stream_ = ~0ull;
  std::int64_t epoch_ = -1;
  std::vector<std::int64_t> order_;
};

}  // namespace pipeforge::train
