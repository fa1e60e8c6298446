// What each action costs: durations of F, I, W and B per stage, the latency of
// a message between ranks, and the activation memory a microbatch holds on a stage.
//
// Times are in one abstract unit chosen by the caller (the CLI documents
// milliseconds); memory is in another (the CLI uses "activations of one
// microbatch on one stage" = 1.0 by default). Every simulator result is in
// those same units.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "schedules/action.h"

namespace pipeforge::schedules {

struct StageCost {
  double forward = 1.0;          // F
  double backward_input = 1.0;   // I
  double backward_weight = 1.0;  // W
  // B (I and W fused). Absent: backward_input + backward_weight.
  std::optional<double> full_backward;
  // Memory one microbatch's activations take on this stage: allocated when its
  // F starts, released by its I or B (see CostModel::weight_memory_share).
  double activation_memory = 1.0;
  // This stage's own share of activation_memory that I keeps for W (measured
  // per stage by `pipeline.schedule: auto`); absent: the model's. Above 1
  // when I allocates more than it frees (what it keeps for W: the gradients
  // of the layers' outputs), which W then releases with the rest.
  std::optional<double> weight_memory_share;

  double fullBackward() const {
    return full_backward ? *full_backward : backward_input + backward_weight;
  }
};

struct CostModel {
  // One entry that applies to every stage, or exactly one entry per stage.
  std::vector<StageCost> stages{StageCost{}};
  // Added to every dependency that crosses ranks (F output to the next stage,
  // input gradient to the previous one). Handoffs between two stages on the
  // same rank are free.
  double comm_latency = 0.0;
  // When the backward is split, the share of a microbatch's activation memory
  // that I keeps alive until its W (the weight gradient still needs the layer
  // inputs); the rest is released when I ends. In [0, 1]. A stage's own
  // StageCost::weight_memory_share takes precedence.
  double weight_memory_share = 0.5;
  // Note [Action overheads]: what a rank spends besides the stages' compute.
  //   send_overhead    posting one message to another rank (the transport
  //                    may copy it out before it returns), on the sender;
  //   recv_overhead    taking one message from another rank in (its RECV),
  //                    on the receiver;
  //   action_overhead  the runtime's own time around every F, I, W or B.
  // A message crosses every stage boundary between two ranks, one per
  // microbatch each way: a stage's F receives its input from the stage
  // before on another rank and sends its output to the stage after on
  // another; its I or B does the same with gradients, the other way. So a
  // layout that keeps neighbouring stages on one rank (the V's turn) sends
  // fewer messages, and the simulators see it: they charge these to the
  // actions through withOverheadsCharged, for the program's own layout.
  double send_overhead = 0.0;
  double recv_overhead = 0.0;
  double action_overhead = 0.0;

  bool hasOverheads() const { return send_overhead != 0.0 || recv_overhead != 0.0 || action_overhead != 0.0; }

  // This model with the overheads above added to each stage's F, I, W and B
  // for the layout `stage_to_rank`, and then zero (so charging twice
  // changes nothing). Unchanged without overheads. Throws ScheduleError when
  // the model does not fit stage_to_rank.size() stages (check).
  CostModel withOverheadsCharged(const std::vector<int>& stage_to_rank) const;

  // The share that applies to `stage`.
  double weightMemoryShare(int stage) const;

  // F, I, W for every stage (B = I + W), activation memory 1.
  static CostModel uniform(double forward, double backward_input, double backward_weight,
                           double comm_latency = 0.0);

  // Every F, I, W and B one unit, no latency: PyTorch's step grid in time
  // (what the emitters use when no costs are given). OVERLAP_F_B takes two.
  static CostModel unitSteps();

  // The costs of `stage`; throws ScheduleError when the model has per-stage
  // entries and `stage` is outside them.
  const StageCost& stage(int stage) const;

  // How long `action` occupies its rank: its F/I/W/B cost, the sum of both
  // halves for OVERLAP_F_B, zero for communication, UNSHARD, RESHARD and REDUCE_GRAD.
  double duration(const Action& action) const;

  // How an action of `type` on `stage` changes its rank's activation memory:
  // F allocates the stage's activation_memory, I releases all but
  // weight_memory_share of it, W that share, B all of it; 0 for other types
  // (ask per sub-action for OVERLAP_F_B). simulateCost, the OrderEvaluator and
  // the list scheduler all account memory with it.
  double memoryChange(ActionType type, int stage) const;

  // Throws ScheduleError when the model cannot describe a program with
  // `num_stages` stages: a per-stage list of another length, a negative or
  // non-finite cost, a non-positive F/I/W/B duration, a share outside [0, 1].
  void check(int num_stages) const;
};

// Parses the CLI form "F,I,W" or "F,I,W,C" (C = comm latency), e.g. "1,1.3,0.7,0.1".
// Throws ScheduleError naming the expected form on anything else.
CostModel parseCostList(std::string_view text);

// Reads a cost model from JSON:
//   {"forward": 1, "backward_input": 1.3, "backward_weight": 0.7,
//    "full_backward": 2, "activation_memory": 1,            // one set for all stages, or
//    "stages": [{"forward": 1, ...}, ...],                    // one object per stage
//    "comm_latency": 0.1, "weight_memory_share": 0.5,
//    "send_overhead": 0.2, "recv_overhead": 0.05, "action_overhead": 0.01}
// Unknown keys are rejected (a typo must not silently become a default).
CostModel costModelFromJson(const nlohmann::json& json);
nlohmann::json costModelToJson(const CostModel& model);

// "F=1 I=1.3 W=0.7 B=2 comm=0.1" (or "per-stage costs (4 stages), comm=0.1").
std::string describeCostModel(const CostModel& model);

}  // namespace pipeforge::schedules
