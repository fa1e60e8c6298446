// The action IR: one step of a pipeline schedule, in PyTorch's text form.
//
// An action prints as `<stage><TYPE>[<microbatch>]`, exactly as
// torch.distributed.pipelining prints `_Action`: `1F0`, `2I3`, `0W1`,
// `1SEND_F2`, `0UNSHARD`, and the composite `(0F7;7B3)OVERLAP_F_B`.
// Actions are plain values: they compare, hash-free order, and round-trip
// through text (formatAction / parseAction).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pipeforge::schedules {

enum class ActionType : std::uint8_t {
  kForward,         // F
  kBackwardInput,   // I  (gradient w.r.t. the stage input only)
  kBackwardWeight,  // W  (gradient w.r.t. the stage parameters only)
  kFullBackward,    // B  (I and W together)
  kUnshard,         // UNSHARD
  kReshard,         // RESHARD
  kSendF,           // SEND_F
  kRecvF,           // RECV_F
  kSendB,           // SEND_B
  kRecvB,           // RECV_B
  kReduceGrad,      // REDUCE_GRAD
  kOverlapFB,       // OVERLAP_F_B: `sub_actions` holds the forward then the backward
};

struct Action {
  int stage = 0;
  ActionType type = ActionType::kForward;
  std::optional<int> microbatch;     // absent for UNSHARD/RESHARD/REDUCE_GRAD/OVERLAP_F_B
  std::vector<Action> sub_actions;   // only for kOverlapFB

  friend bool operator==(const Action& a, const Action& b) {
    return a.stage == b.stage && a.type == b.type && a.microbatch == b.microbatch &&
           a.sub_actions == b.sub_actions;
  }
  friend bool operator!=(const Action& a, const Action& b) { return !(a == b); }
};

// The token PyTorch uses for a type: "F", "SEND_B", "OVERLAP_F_B", ...
std::string_view actionTypeName(ActionType type);

// True for F, I, W, B and OVERLAP_F_B (the actions that run stage code).
bool isCompute(ActionType type);

// `1F0`, `0UNSHARD`, `(0F7;7B3)OVERLAP_F_B`.
std::string formatAction(const Action& action);

// Inverse of formatAction. Throws ScheduleError naming the expected form on
// malformed text.
Action parseAction(std::string_view text);

}  // namespace pipeforge::schedules
