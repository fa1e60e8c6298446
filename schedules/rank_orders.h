// A compact compute-only schedule for search: per rank, the order of its
// F/I/W/B operations. The auto scheduler builds, evaluates and edits these,
// and converts to and from Program at its edges.
#pragma once

#include <cstdint>
#include <vector>

#include "schedules/program.h"

namespace pipeforge::schedules {

enum class OpKind : std::uint8_t { kF, kI, kW, kB };

struct Op {
  OpKind kind = OpKind::kF;
  int stage = 0;
  int microbatch = 0;

  friend bool operator==(const Op& a, const Op& b) {
    return a.kind == b.kind && a.stage == b.stage && a.microbatch == b.microbatch;
  }
};

struct RankOrders {
  int num_ranks = 0;
  int num_stages = 0;
  int num_microbatches = 0;
  std::vector<int> stage_to_rank;
  std::vector<std::vector<Op>> ops;  // [rank][position]

  std::size_t size() const;  // number of ops over all ranks
};

ActionType toActionType(OpKind kind);
Action toAction(const Op& op);

// The compute-only Program with these orders (no empty cells).
Program toProgram(const RankOrders& orders);

// The orders of a compute-only program: empty cells dropped, OVERLAP_F_B
// expanded into its halves in order. Throws ScheduleError on communication,
// UNSHARD/RESHARD or REDUCE_GRAD actions (lowered programs cannot be reordered
// freely; pass the compute-only program).
RankOrders fromProgram(const Program& program);

}  // namespace pipeforge::schedules
