// The dependency rule: what must finish before a compute action may start.
//
// Note [One dependency rule]: for one microbatch, stage s reads the output of
// its source stage (s-1) and sends the gradient of its input back to it:
//   F(s)   needs the activation of each source stage (F(s-1));
//   I/B(s) needs F(s), then the input gradient of each stage that reads s
//          (I or B of s+1);
//   W(s)   needs I(s) (B computes its weight gradient itself).
// This file is the only place that says so. The generators' step alignment,
// addSendRecv, simulateUnit, simulateCost, the OrderEvaluator and the list
// scheduler all ask a DependencyRule, so a new action type or edge is one edit.
// Whether an input crosses ranks (a SEND/RECV pair once lowered) depends on the
// placement only: crossesRanks().
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "schedules/action.h"

namespace pipeforge::schedules {

// What running a compute action makes available, per (stage, microbatch).
enum class Product : std::uint8_t {
  kActivation,       // F ran: the stage's output (and its saved activations) exist
  kInputGrad,        // I or B ran: the gradient w.r.t. the stage's input exists
  kWeightGradReady,  // I ran: W of the stage may run
};
inline constexpr int kNumProducts = 3;

// One thing a compute action waits for: `product` of `stage`, same microbatch.
struct Input {
  Product product = Product::kActivation;
  int stage = 0;

  friend bool operator==(const Input& a, const Input& b) {
    return a.product == b.product && a.stage == b.stage;
  }
};

// A data edge between stages: stage `to` reads the output of stage `from`
// (and sends the gradient of that input back). The plain pipeline has the
// edges s-1 -> s; Note [Skip edges] describes the others.
struct StageEdge {
  int from = 0;
  int to = 0;
};

// The products `type` makes when it ends, in the order they become visible:
// F {activation}; I {input grad, weight-grad ready}; B {input grad}; W and
// every non-compute type {}. OVERLAP_F_B: ask per sub-action.
const std::vector<Product>& productsOf(ActionType type);

// The compute types that make `product`, in F, I, W, B order: {F}, {I, B}, {I}.
const std::vector<ActionType>& producersOf(Product product);

// The SEND/RECV types that carry `product` between ranks: SEND_F/RECV_F the
// activation, SEND_B/RECV_B the input gradient. Asserts on kWeightGradReady,
// which never leaves its stage.
ActionType sendTypeFor(Product product);
ActionType recvTypeFor(Product product);

// The product a SEND_x/RECV_x carries; nullopt for every other type.
std::optional<Product> productCarriedBy(ActionType type);

class DependencyRule {
 public:
  // The pipeline of `num_stages` stages, stage s reading stage s-1.
  explicit DependencyRule(int num_stages);

  // Note [Skip edges]: the pipeline plus `extra_edges` (from < to), for a stage
  // that also reads a non-adjacent earlier stage (the runtime already sends
  // such values). inputsOf/readersOf/sourcesOf honour them; the lowering and
  // the simulators still build the plain pipeline, because SEND/RECV name no
  // peer stage in the action IR.
  DependencyRule(int num_stages, const std::vector<StageEdge>& extra_edges);

  int numStages() const { return num_stages_; }

  // What must finish before `type` of `stage` may start (same microbatch), in
  // the order the simulators check it: F: each source's activation; I/B: the
  // stage's own F, then each reader's input gradient; W: the stage's own I.
  // Empty for non-compute types and OVERLAP_F_B (ask per sub-action).
  const std::vector<Input>& inputsOf(ActionType type, int stage) const;

  // The other stages that wait for `product` of `stage`: activation: the
  // stages reading it (s+1); input grad: the stages it was read from (s-1);
  // weight-grad ready: none.
  const std::vector<int>& readersOf(Product product, int stage) const;

  // The other stages whose `product` `stage` waits for (inverse of readersOf).
  const std::vector<int>& sourcesOf(Product product, int stage) const;

 private:
  int num_stages_;
  std::vector<std::vector<Input>> inputs_;  // [compute kind * S + stage], kinds F, I, W, B
  std::vector<std::vector<int>> readers_;   // [product * S + stage]
  std::vector<std::vector<int>> sources_;   // [product * S + stage]
};

// Whether `input`, read by `consumer_stage`, travels between ranks (becomes a
// SEND/RECV pair once lowered): its stage lives on another rank.
inline bool crossesRanks(const Input& input, int consumer_stage,
                         const std::vector<int>& stage_to_rank) {
  return stage_to_rank[input.stage] != stage_to_rank[consumer_stage];
}

}  // namespace pipeforge::schedules
