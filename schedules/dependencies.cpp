#include "schedules/dependencies.h"

#include <cassert>

namespace pipeforge::schedules {

namespace {

// The compute kinds in table order; -1 for the rest.
int computeIndex(ActionType type) {
  switch (type) {
    case ActionType::kForward:
      return 0;
    case ActionType::kBackwardInput:
      return 1;
    case ActionType::kBackwardWeight:
      return 2;
    case ActionType::kFullBackward:
      return 3;
    case ActionType::kUnshard:
    case ActionType::kReshard:
    case ActionType::kSendF:
    case ActionType::kRecvF:
    case ActionType::kSendB:
    case ActionType::kRecvB:
    case ActionType::kReduceGrad:
    case ActionType::kOverlapFB:
      return -1;
  }
  return -1;
}

const std::vector<Input> kNoInputs;
const std::vector<Product> kNoProducts;

}  // namespace

const std::vector<Product>& productsOf(ActionType type) {
  static const std::vector<Product> forward{Product::kActivation};
  static const std::vector<Product> input{Product::kInputGrad, Product::kWeightGradReady};
  static const std::vector<Product> full{Product::kInputGrad};
  switch (type) {
    case ActionType::kForward:
      return forward;
    case ActionType::kBackwardInput:
      return input;
    case ActionType::kFullBackward:
      return full;
    case ActionType::kBackwardWeight:
    case ActionType::kUnshard:
    case ActionType::kReshard:
    case ActionType::kSendF:
    case ActionType::kRecvF:
    case ActionType::kSendB:
    case ActionType::kRecvB:
    case ActionType::kReduceGrad:
    case ActionType::kOverlapFB:
      return kNoProducts;
  }
  return kNoProducts;
}

const std::vector<ActionType>& producersOf(Product product) {
  static const std::vector<ActionType> activation{ActionType::kForward};
  static const std::vector<ActionType> input_grad{ActionType::kBackwardInput,
                                                  ActionType::kFullBackward};
  static const std::vector<ActionType> weight_ready{ActionType::kBackwardInput};
  switch (product) {
    case Product::kActivation:
      return activation;
    case Product::kInputGrad:
      return input_grad;
    case Product::kWeightGradReady:
      return weight_ready;
  }
  return activation;
}

ActionType sendTypeFor(Product product) {
  switch (product) {
    case Product::kActivation:
      return ActionType::kSendF;
    case Product::kInputGrad:
      return ActionType::kSendB;
    case Product::kWeightGradReady:
      break;
  }
  assert(false && "the weight-grad state of a stage never leaves its stage");
  return ActionType::kSendB;
}

ActionType recvTypeFor(Product product) {
  switch (product) {
    case Product::kActivation:
      return ActionType::kRecvF;
    case Product::kInputGrad:
      return ActionType::kRecvB;
    case Product::kWeightGradReady:
      break;
  }
  assert(false && "the weight-grad state of a stage never leaves its stage");
  return ActionType::kRecvB;
}

std::optional<Product> productCarriedBy(ActionType type) {
  switch (type) {
    case ActionType::kSendF:
    case ActionType::kRecvF:
      return Product::kActivation;
    case ActionType::kSendB:
    case ActionType::kRecvB:
      return Product::kInputGrad;
    case ActionType::kForward:
    case ActionType::kBackwardInput:
    case ActionType::kBackwardWeight:
    case ActionType::kFullBackward:
    case ActionType::kUnshard:
    case ActionType::kReshard:
    case ActionType::kReduceGrad:
    case ActionType::kOverlapFB:
      return std::nullopt;
  }
  unknownActionType(type);
}

DependencyRule::DependencyRule(int num_stages) : DependencyRule(num_stages, {}) {}

DependencyRule::DependencyRule(int num_stages, const std::vector<StageEdge>& extra_edges)
    : num_stages_(num_stages) {
  const auto S = static_cast<std::size_t>(num_stages);
  std::vector<StageEdge> edges;
  for (int s = 1; s < num_stages; ++s) edges.push_back({s - 1, s});
  for (const StageEdge& e : extra_edges) {
    assert(0 <= e.from && e.from < e.to && e.to < num_stages && "a stage edge goes forward");
    edges.push_back(e);
  }

  // The activation travels along each edge, the input gradient against it.
  readers_.assign(kNumProducts * S, {});
  sources_.assign(kNumProducts * S, {});
  auto at = [S](Product p, int stage) { return static_cast<std::size_t>(p) * S + stage; };
  for (const StageEdge& e : edges) {
    readers_[at(Product::kActivation, e.from)].push_back(e.to);
    sources_[at(Product::kActivation, e.to)].push_back(e.from);
    readers_[at(Product::kInputGrad, e.to)].push_back(e.from);
    sources_[at(Product::kInputGrad, e.from)].push_back(e.to);
  }

  inputs_.assign(4 * S, {});
  for (int s = 0; s < num_stages; ++s) {
    auto& forward = inputs_[computeIndex(ActionType::kForward) * S + s];
    for (int from : sources_[at(Product::kActivation, s)]) {
      forward.push_back({Product::kActivation, from});
    }
    std::vector<Input> backward{{Product::kActivation, s}};
    for (int from : sources_[at(Product::kInputGrad, s)]) {
      backward.push_back({Product::kInputGrad, from});
    }
    inputs_[computeIndex(ActionType::kBackwardInput) * S + s] = backward;
    inputs_[computeIndex(ActionType::kFullBackward) * S + s] = backward;
    inputs_[computeIndex(ActionType::kBackwardWeight) * S + s] = {
        {Product::kWeightGradReady, s}};
  }
}

const std::vector<Input>& DependencyRule::inputsOf(ActionType type, int stage) const {
  assert(0 <= stage && stage < num_stages_);
  const int kind = computeIndex(type);
  if (kind < 0) return kNoInputs;
  return inputs_[static_cast<std::size_t>(kind) * num_stages_ + stage];
}

const std::vector<int>& DependencyRule::readersOf(Product product, int stage) const {
  assert(0 <= stage && stage < num_stages_);
  return readers_[static_cast<std::size_t>(product) * num_stages_ + stage];
}

const std::vector<int>& DependencyRule::sourcesOf(Product product, int stage) const {
  assert(0 <= stage && stage < num_stages_);
  return sources_[static_cast<std::size_t>(product) * num_stages_ + stage];
}

}  // namespace pipeforge::schedules
