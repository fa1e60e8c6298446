// The order in which a rank posts its messages with each peer, one both
// ends agree on, so that NCCL's pairing of ops by order (Note [NCCL order]
// in comm.h) pairs every send with its own receive.
#pragma once

#include <map>
#include <vector>

#include "runtime/wire_protocol.h"
#include "schedules/program.h"

namespace pipeforge::runtime {

struct CommPlan;

// Note [Pair order]
// ~~~~~~~~~~~~~~~~~
// Each message of a step (a forward value, with its shape message just
// before it when one is sent, or a gradient) gets a number from one replay
// of the lowered program on every rank at once: ranks take turns, one
// compute action each, as addSendRecv does; an action runs once every
// message it waits for was sent, and numbers its own sends in the order the
// executor sends them. Every rank posts its ops with a peer in the order of
// these numbers: a send when its compute action made it, a receive at the
// latest just before the first later op with that peer (or when it is
// needed). Both ends post the same list, so the k-th ops pair. It cannot
// deadlock: whatever a rank waits for has a smaller number than anything it
// has yet to post, and that was sent earlier in the replay, when it needed
// only messages of smaller numbers still.
//
// Why not post in the order of the actions: with 1F1B on two ranks, rank 0
// runs F0 F1 B0 and rank 1 runs F0 B0 F1, so rank 0 sends F1 while rank 1
// sends B0: two sends pair, and NCCL hangs. Numbered, the pair's order is
// F0 F1 B0: rank 1 posts the receive of F1 before it sends B0.
// The same holds for a skip edge (stage 0 -> 2) against the adjacent edges
// the schedule orders, and for the several edges between two stages.
struct PairMessage {
  int edge = 0;
  int mb = 0;
  MessageKind kind = MessageKind::kValue;  // kValue (with its kMeta before it) or kGrad

  bool operator==(const PairMessage& o) const { return edge == o.edge && mb == o.mb && kind == o.kind; }
};

// For each peer pipeline rank, the messages `pipeline_rank` exchanges with it
// in a training step of `lowered` (one that runs the compute actions of a
// lowered program, as ScheduleExecutor does), in pair order. An eval step
// keeps the values in the same order. Gradients of values that are not
// floating point are never sent: both ends skip them. Throws Error{kInternal}
// when an action waits for a message no rank sends before it.
std::map<int, std::vector<PairMessage>> pairOrder(const schedules::Program& lowered, const CommPlan& plan,
                                                  int pipeline_rank);

}  // namespace pipeforge::runtime
