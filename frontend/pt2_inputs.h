// The sizes an exported program accepts for its tensor inputs: fixed where
// torch.export saw a static dimension, a range where it was made dynamic
// (torch.export.Dim). Training feeds microbatches, so a static batch that
// differs from the microbatch must be refused before any rank starts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pipeforge::frontend {

class Pt2Archive;

struct Pt2DimRange {
  std::int64_t min = 0;
  std::int64_t max = -1;  // -1: no upper bound
  bool isStatic() const { return min == max; }
};

// One entry per user input of the program, in order; `dims` is empty for an
// input that is not a tensor.
struct Pt2UserInput {
  std::string name;
  std::vector<Pt2DimRange> dims;
  // The sizes torch.export saw (a dynamic dim's hint); -1 where it wrote none.
  std::vector<std::int64_t> example;
  // Its dtype as common/dtype_names.h names it ("float32"); "" for one it
  // does not name (uint8, ...) or an input without tensor metadata.
  std::string dtype;
};

// Throws Pt2Error when the program's metadata for an input is malformed.
std::vector<Pt2UserInput> pt2UserInputs(const Pt2Archive& archive);

}  // namespace pipeforge::frontend
