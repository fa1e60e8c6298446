#include "mesh/mesh_layout.h"

#include <algorithm>

namespace pipeforge::mesh {

const char* axisName(Axis axis) {
  switch (axis) {
    case Axis::kTp:
      return "tp";
    case Axis::kPp:
      return "pp";
    case Axis::kDp:
      return "dp";
  }
  return "?";
}

int MeshSizes::of(Axis axis) const {
  switch (axis) {
    case Axis::kTp:
      return tp;
    case Axis::kPp:
      return pp;
    case Axis::kDp:
      return dp;
  }
  return 1;
}

int MeshCoords::of(Axis axis) const {
  switch (axis) {
    case Axis::kTp:
      return tp;
    case Axis::kPp:
      return pp;
    case Axis::kDp:
      return dp;
  }
  return 0;
}

namespace {

std::string product(const MeshSizes& s) {
  return "pp " + std::to_string(s.pp) + " × tp " + std::to_string(s.tp) + " × dp " + std::to_string(s.dp);
}

MeshCoords with(MeshCoords c, Axis axis, int value) {
  switch (axis) {
    case Axis::kTp:
      c.tp = value;
      break;
    case Axis::kPp:
      c.pp = value;
      break;
    case Axis::kDp:
      c.dp = value;
      break;
  }
  return c;
}

}  // namespace

MeshLayout MeshLayout::create(MeshSizes sizes, int world_size) {
  for (Axis axis : kAxes) {
    if (sizes.of(axis) < 1) {
      throw MeshError(std::string("the mesh's ") + axisName(axis) + " size is " + std::to_string(sizes.of(axis)) +
                      "; every size must be at least 1");
    }
  }
  const long long total = 1LL * sizes.pp * sizes.tp * sizes.dp;
  if (total != world_size) {
    throw MeshError(product(sizes) + " = " + std::to_string(total) + " ≠ world size " + std::to_string(world_size) +
                    "; the sizes must multiply to the number of ranks");
  }
  return MeshLayout(sizes);
}

MeshLayout MeshLayout::fromWorld(int world_size, int tp, int dp) {
  if (tp < 1 || dp < 1) {
    throw MeshError("tensor and data parallel sizes must be at least 1 (got tp " + std::to_string(tp) + ", dp " +
                    std::to_string(dp) + ")");
  }
  if (world_size < 1 || world_size % (tp * dp) != 0) {
    throw MeshError("world size " + std::to_string(world_size) + " is not a multiple of tp " + std::to_string(tp) +
                    " × dp " + std::to_string(dp) + " = " + std::to_string(tp * dp) +
                    "; change pipeline.data_parallel or the number of ranks so that it divides them");
  }
  return create(MeshSizes{world_size / (tp * dp), tp, dp}, world_size);
}

MeshCoords MeshLayout::coordsOf(int rank) const {
  if (rank < 0 || rank >= worldSize()) {
    throw MeshError("rank " + std::to_string(rank) + " is outside the mesh " + describe());
  }
  MeshCoords c;
  c.tp = rank % sizes_.tp;
  c.pp = (rank / sizes_.tp) % sizes_.pp;
  c.dp = rank / (sizes_.tp * sizes_.pp);
  return c;
}

int MeshLayout::rankOf(const MeshCoords& c) const {
  for (Axis axis : kAxes) {
    if (c.of(axis) < 0 || c.of(axis) >= size(axis)) {
      throw MeshError(std::string(axisName(axis)) + " coordinate " + std::to_string(c.of(axis)) +
                      " is outside the mesh " + describe());
    }
  }
  return c.tp + sizes_.tp * (c.pp + sizes_.pp * c.dp);
}

std::vector<int> MeshLayout::group(Axis axis, int rank) const {
  const MeshCoords here = coordsOf(rank);
  std::vector<int> ranks;
  ranks.reserve(static_cast<std::size_t>(size(axis)));
  for (int i = 0; i < size(axis); ++i) ranks.push_back(rankOf(with(here, axis, i)));
  return ranks;
}

std::vector<std::vector<int>> MeshLayout::groups(Axis axis) const {
  std::vector<std::vector<int>> out;
  for (int rank = 0; rank < worldSize(); ++rank) {
    if (coordsOf(rank).of(axis) == 0) out.push_back(group(axis, rank));
  }
  return out;  // by first rank: each group's first member has coordinate 0, visited in rank order
}

std::string MeshLayout::describe() const { return product(sizes_) + " on " + std::to_string(worldSize()) + " ranks"; }

}  // namespace pipeforge::mesh
