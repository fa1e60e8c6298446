// The action IR: one step of a pipeline schedule, in PyTorch's text form.
//
// An action prints as `<stage><TYPE>[<microbatch>]`, exactly as
// torch.distributed.pipelining prints `_Action`: `1F0`, `2I3`, `0W1`,
// `1SEND_F2`, `0UNSHARD`, and the composite `(0F7;7B3)OVERLAP_F_B`.
// Actions are plain values: they compare, hash-free order, and round-trip
// through text (formatAction / parseAction).
#pragma once

#include <cstddef>
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

// Switches over ActionType name every enumerator (no `default:`), so a new
// action type is a compile warning at each place that must decide about it;
// after the switch they call this, which fails a check (Error kInternal): only a
// value outside the enum gets there.
[[noreturn]] void unknownActionType(ActionType type);

// False for UNSHARD, RESHARD, REDUCE_GRAD and OVERLAP_F_B, which name no microbatch.
bool takesMicrobatch(ActionType type);

// True for F, I, W, B and OVERLAP_F_B (the actions that run stage code).
bool isCompute(ActionType type);

// `1F0`, `0UNSHARD`, `(0F7;7B3)OVERLAP_F_B`.
std::string formatAction(const Action& action);

// Inverse of formatAction. Throws ScheduleError naming the expected form on
// malformed text.
Action parseAction(std::string_view text);

// Stricter than PyTorch's `_Action.from_str` (which uses a prefix regex match):
//  * the whole text must be consumed (`1F0x` is an error, not `1F0`);
//  * F/I/W/B/SEND_*/RECV_* need a microbatch, UNSHARD/RESHARD/REDUCE_GRAD take none;
//  * a composite holds one or more F/I/W/B sub-actions and ends in OVERLAP_F_B.
// Surrounding whitespace is ignored, as in PyTorch. Composite actions parse
// with stage -1, like PyTorch's container `_Action`.

// The identity of a non-composite action (stage, type, microbatch; -1 when it
// has none), for hash sets in passes and simulators. OVERLAP_F_B has no key of
// its own: use its sub-actions.
struct ActionKey {
  int stage = 0;
  ActionType type = ActionType::kForward;
  int microbatch = -1;

  friend bool operator==(const ActionKey& a, const ActionKey& b) {
    return a.stage == b.stage && a.type == b.type && a.microbatch == b.microbatch;
  }
};

inline ActionKey keyOf(const Action& action) {
  return ActionKey{action.stage, action.type, action.microbatch.value_or(-1)};
}

struct ActionKeyHash {
  std::size_t operator()(const ActionKey& key) const {
    std::uint64_t h = static_cast<std::uint32_t>(key.stage);
    h = h * 0x9E3779B97F4A7C15ULL + static_cast<std::uint64_t>(key.type);
    h = h * 0x9E3779B97F4A7C15ULL + static_cast<std::uint32_t>(key.microbatch);
    return static_cast<std::size_t>(h ^ (h >> 29));
  }
};

}  // namespace pipeforge::schedules
