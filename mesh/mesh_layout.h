// Which global rank holds which part of a run: the pp × tp × dp mesh as
// plain arithmetic, with no communicator (Note [Mesh order]). Every process
// group a run makes is a group of this layout; nothing else computes ranks.
//
// Note [Mesh order]: a rank's coordinates, innermost first, are
//   rank = tp + TP × (pp + PP × dp)
// e.g. pp 2 × tp 2 × dp 2 on 8 ranks:
//   rank  0  1  2  3  4  5  6  7
//   tp    0  1  0  1  0  1  0  1
//   pp    0  0  1  1  0  0  1  1
//   dp    0  0  0  0  1  1  1  1
// so rank 5's tensor-parallel group is {4, 5}, its pipeline {5, 7}, its
// data-parallel group {1, 5}.
//   - tp innermost: its collectives run inside every layer, so its ranks
//     are consecutive, on one host where a host holds at least TP ranks
//     (Megatron's default order puts tp first too).
//   - pp before dp: one replica's pipeline is consecutive ranks, as
//     Pipeforge placed them before the mesh existed (replica r / PP,
//     pipeline rank r % PP); checkpoints and the launcher's host placement
//     rely on it, and with TP = 1 the formula is that one.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "common/error.h"

namespace pipeforge::mesh {

// Innermost first (Note [Mesh order]).
enum class Axis { kTp, kPp, kDp };
inline constexpr std::array<Axis, 3> kAxes = {Axis::kTp, Axis::kPp, Axis::kDp};

// "tp", "pp", "dp".
const char* axisName(Axis axis);

class MeshError : public Error {
 public:
  explicit MeshError(const std::string& message) : Error(ErrorCode::kUserInput, message) {}
};

struct MeshSizes {
  int pp = 1;
  int tp = 1;
  int dp = 1;
  int of(Axis axis) const;
  friend bool operator==(const MeshSizes& a, const MeshSizes& b) {
    return a.pp == b.pp && a.tp == b.tp && a.dp == b.dp;
  }
};

struct MeshCoords {
  int pp = 0;
  int tp = 0;
  int dp = 0;
  int of(Axis axis) const;
  friend bool operator==(const MeshCoords& a, const MeshCoords& b) {
    return a.pp == b.pp && a.tp == b.tp && a.dp == b.dp;
  }
};

class MeshLayout {
 public:
  // One rank: every size 1.
  MeshLayout() = default;
  // Throws MeshError when a size is below 1 or their product is not the
  // world size, showing the numbers: "pp 2 × tp 4 × dp 3 = 24 ≠ world size 16".
  static MeshLayout create(MeshSizes sizes, int world_size);
  // The pipeline takes what tensor and data parallelism leave: pp = world /
  // (tp × dp). Throws MeshError, naming the setting to change, when tp × dp
  // does not divide the world.
  static MeshLayout fromWorld(int world_size, int tp, int dp);

  const MeshSizes& sizes() const { return sizes_; }
  int size(Axis axis) const { return sizes_.of(axis); }
  int worldSize() const { return sizes_.pp * sizes_.tp * sizes_.dp; }

  // Throws MeshError for a rank outside [0, worldSize()).
  MeshCoords coordsOf(int rank) const;
  // Throws MeshError for a coordinate outside its axis.
  int rankOf(const MeshCoords& coords) const;

  // The global ranks of `rank`'s group along `axis`: the ranks whose other
  // coordinates equal its own, in order of that axis' coordinate.
  std::vector<int> group(Axis axis, int rank) const;
  // Every group along `axis`, ordered by their first rank. Each rank is in
  // exactly one; together they cover the world.
  std::vector<std::vector<int>> groups(Axis axis) const;

  // "pp 2 × tp 1 × dp 2 on 4 ranks".
  std::string describe() const;

  friend bool operator==(const MeshLayout& a, const MeshLayout& b) { return a.sizes_ == b.sizes_; }

 private:
  explicit MeshLayout(MeshSizes sizes) : sizes_(sizes) {}
  MeshSizes sizes_{};
};

}  // namespace pipeforge::mesh
