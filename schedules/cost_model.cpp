#include "schedules/cost_model.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "schedules/program.h"

namespace pipeforge::schedules {

CostModel CostModel::uniform(double forward, double backward_input, double backward_weight,
                             double comm_latency) {
  CostModel model;
  model.stages = {StageCost{forward, backward_input, backward_weight, std::nullopt, 1.0}};
  model.comm_latency = comm_latency;
  return model;
}

CostModel CostModel::unitSteps() {
  CostModel model = uniform(1.0, 1.0, 1.0, 0.0);
  model.stages.front().full_backward = 1.0;
  return model;
}

const StageCost& CostModel::stage(int stage) const {
  if (stages.size() == 1) return stages.front();
  if (stage < 0 || static_cast<std::size_t>(stage) >= stages.size()) {
    throw ScheduleError(fmt::format(
        "cost model: no costs for stage {}: the model lists {} stages; give one cost set "
        "for all stages or exactly one per stage",
        stage, stages.size()));
  }
  return stages[static_cast<std::size_t>(stage)];
}

double CostModel::duration(const Action& action) const {
  switch (action.type) {
    case ActionType::kForward:
      return stage(action.stage).forward;
    case ActionType::kBackwardInput:
      return stage(action.stage).backward_input;
    case ActionType::kBackwardWeight:
      return stage(action.stage).backward_weight;
    case ActionType::kFullBackward:
      return stage(action.stage).fullBackward();
    case ActionType::kOverlapFB: {
      double total = 0.0;
      for (const Action& sub : action.sub_actions) total += duration(sub);
      return total;
    }
    case ActionType::kUnshard:
    case ActionType::kReshard:
    case ActionType::kSendF:
    case ActionType::kRecvF:
    case ActionType::kSendB:
    case ActionType::kRecvB:
    case ActionType::kReduceGrad:
      return 0.0;
  }
  unknownActionType(action.type);
}

CostModel CostModel::withOverheadsCharged(const std::vector<int>& stage_to_rank) const {
  if (!hasOverheads()) return *this;
  const int S = static_cast<int>(stage_to_rank.size());
  check(S);
  CostModel charged = *this;
  charged.send_overhead = charged.recv_overhead = charged.action_overhead = 0.0;
  charged.stages.clear();
  for (int s = 0; s < S; ++s) {
    const bool from_before = s > 0 && stage_to_rank[s - 1] != stage_to_rank[s];
    const bool to_after = s + 1 < S && stage_to_rank[s + 1] != stage_to_rank[s];
    const StageCost& own = stage(s);
    StageCost c = own;
    // F takes its input from the stage before and sends its output on; the
    // backward takes the gradient from the stage after and sends one back.
    c.forward += action_overhead + (from_before ? recv_overhead : 0.0) + (to_after ? send_overhead : 0.0);
    const double backward_messages = (to_after ? recv_overhead : 0.0) + (from_before ? send_overhead : 0.0);
    c.backward_input += action_overhead + backward_messages;
    c.backward_weight += action_overhead;
    c.full_backward = own.fullBackward() + action_overhead + backward_messages;
    charged.stages.push_back(c);
  }
  return charged;
}

double CostModel::weightMemoryShare(int stage_index) const {
  return stage(stage_index).weight_memory_share.value_or(weight_memory_share);
}

double CostModel::memoryChange(ActionType type, int stage_index) const {
  switch (type) {
    case ActionType::kForward:
      return stage(stage_index).activation_memory;
    case ActionType::kBackwardInput:
      return -(stage(stage_index).activation_memory * (1.0 - weightMemoryShare(stage_index)));
    case ActionType::kBackwardWeight:
      return -(stage(stage_index).activation_memory * weightMemoryShare(stage_index));
    case ActionType::kFullBackward:
      return -stage(stage_index).activation_memory;
    case ActionType::kUnshard:
    case ActionType::kReshard:
    case ActionType::kSendF:
    case ActionType::kRecvF:
    case ActionType::kSendB:
    case ActionType::kRecvB:
    case ActionType::kReduceGrad:
    case ActionType::kOverlapFB:
      return 0.0;
  }
  unknownActionType(type);
}

namespace {

void checkFinite(double value, std::string_view what, bool positive) {
  if (!std::isfinite(value) || value < 0.0 || (positive && value == 0.0)) {
    throw ScheduleError(fmt::format("cost model: {} is {}; expected a finite number {} 0",
                                    what, value, positive ? ">" : ">="));
  }
}

}  // namespace

void CostModel::check(int num_stages) const {
  if (stages.empty()) {
    throw ScheduleError("cost model: no stage costs; give one cost set for all stages");
  }
  if (stages.size() != 1 && stages.size() != static_cast<std::size_t>(num_stages)) {
    throw ScheduleError(fmt::format(
        "cost model: {} per-stage cost sets for a program with {} stages; give one set for "
        "all stages or exactly {}",
        stages.size(), num_stages, num_stages));
  }
  for (std::size_t s = 0; s < stages.size(); ++s) {
    const StageCost& c = stages[s];
    std::string where = stages.size() == 1 ? std::string() : fmt::format(" of stage {}", s);
    checkFinite(c.forward, "F duration" + where, true);
    checkFinite(c.backward_input, "I duration" + where, true);
    checkFinite(c.backward_weight, "W duration" + where, true);
    checkFinite(c.fullBackward(), "B duration" + where, true);
    checkFinite(c.activation_memory, "activation memory" + where, false);
    if (c.weight_memory_share && !(*c.weight_memory_share >= 0.0 && std::isfinite(*c.weight_memory_share))) {
      throw ScheduleError(fmt::format("cost model: weight_memory_share{} is {}; expected a number >= 0 (above 1: I "
                                      "allocates what W then frees)",
                                      where, *c.weight_memory_share));
    }
  }
  checkFinite(comm_latency, "comm latency", false);
  checkFinite(send_overhead, "send overhead", false);
  checkFinite(recv_overhead, "recv overhead", false);
  checkFinite(action_overhead, "action overhead", false);
  if (!(weight_memory_share >= 0.0 && weight_memory_share <= 1.0)) {
    throw ScheduleError(fmt::format(
        "cost model: weight_memory_share is {}; expected a fraction in [0, 1]",
        weight_memory_share));
  }
}

CostModel parseCostList(std::string_view text) {
  constexpr std::string_view kForm =
      "expected \"F,I,W\" or \"F,I,W,C\" (durations of forward, backward-input, "
      "backward-weight and the comm latency), e.g. \"1,1.3,0.7,0.1\"";
  std::vector<double> values;
  std::size_t begin = 0;
  while (true) {
    std::size_t comma = text.find(',', begin);
    std::string field(text.substr(begin, comma == std::string_view::npos ? std::string_view::npos
                                                                          : comma - begin));
    char* end = nullptr;
    errno = 0;
    double value = std::strtod(field.c_str(), &end);
    if (field.empty() || end != field.c_str() + field.size() || errno != 0) {
      throw ScheduleError(fmt::format("costs \"{}\": \"{}\" is not a number; {}", text, field,
                                      kForm));
    }
    values.push_back(value);
    if (comma == std::string_view::npos) break;
    begin = comma + 1;
  }
  if (values.size() != 3 && values.size() != 4) {
    throw ScheduleError(
        fmt::format("costs \"{}\": {} values; {}", text, values.size(), kForm));
  }
  CostModel model = CostModel::uniform(values[0], values[1], values[2],
                                       values.size() == 4 ? values[3] : 0.0);
  model.check(1);
  return model;
}

namespace {

double readNumber(const nlohmann::json& json, std::string_view key) {
  const nlohmann::json& value = json.at(std::string(key));
  if (!value.is_number()) {
    throw ScheduleError(fmt::format("cost model JSON: \"{}\" is {}; expected a number", key,
                                    value.dump()));
  }
  return value.get<double>();
}

StageCost readStage(const nlohmann::json& json, const StageCost& defaults,
                    const std::set<std::string>& extra_keys) {
  static const std::set<std::string> kKeys = {"forward", "backward_input", "backward_weight",
                                              "full_backward", "activation_memory",
                                              "weight_memory_share"};
  if (!json.is_object()) {
    throw ScheduleError(
        fmt::format("cost model JSON: expected an object of costs, got {}", json.dump()));
  }
  for (const auto& item : json.items()) {
    if (!kKeys.count(item.key()) && !extra_keys.count(item.key())) {
      throw ScheduleError(fmt::format(
          "cost model JSON: unknown key \"{}\"; expected forward, backward_input, "
          "backward_weight, full_backward, activation_memory, weight_memory_share{}",
          item.key(), extra_keys.empty() ? "" : ", stages, comm_latency, send_overhead, recv_overhead, action_overhead"));
    }
  }
  StageCost cost = defaults;
  if (json.contains("forward")) cost.forward = readNumber(json, "forward");
  if (json.contains("backward_input")) cost.backward_input = readNumber(json, "backward_input");
  if (json.contains("backward_weight")) {
    cost.backward_weight = readNumber(json, "backward_weight");
  }
  if (json.contains("full_backward")) cost.full_backward = readNumber(json, "full_backward");
  if (json.contains("activation_memory")) {
    cost.activation_memory = readNumber(json, "activation_memory");
  }
  // At the top level the share is the model's (CostModel::weight_memory_share).
  if (extra_keys.empty() && json.contains("weight_memory_share")) {
    cost.weight_memory_share = readNumber(json, "weight_memory_share");
  }
  return cost;
}

}  // namespace

CostModel costModelFromJson(const nlohmann::json& json) {
  CostModel model;
  StageCost shared =
      readStage(json, StageCost{},
                {"stages", "comm_latency", "weight_memory_share", "send_overhead", "recv_overhead", "action_overhead"});
  if (json.contains("stages")) {
    const nlohmann::json& list = json.at("stages");
    if (!list.is_array() || list.empty()) {
      throw ScheduleError("cost model JSON: \"stages\" must be a non-empty array of objects");
    }
    model.stages.clear();
    for (const nlohmann::json& entry : list) model.stages.push_back(readStage(entry, shared, {}));
  } else {
    model.stages = {shared};
  }
  if (json.contains("comm_latency")) model.comm_latency = readNumber(json, "comm_latency");
  if (json.contains("send_overhead")) model.send_overhead = readNumber(json, "send_overhead");
  if (json.contains("recv_overhead")) model.recv_overhead = readNumber(json, "recv_overhead");
  if (json.contains("action_overhead")) model.action_overhead = readNumber(json, "action_overhead");
  if (json.contains("weight_memory_share")) {
    model.weight_memory_share = readNumber(json, "weight_memory_share");
  }
  model.check(static_cast<int>(model.stages.size()));
  return model;
}

nlohmann::json costModelToJson(const CostModel& model) {
  auto stage_json = [](const StageCost& c) {
    nlohmann::json j = {{"forward", c.forward},
                        {"backward_input", c.backward_input},
                        {"backward_weight", c.backward_weight},
                        {"activation_memory", c.activation_memory}};
    if (c.full_backward) j["full_backward"] = *c.full_backward;
    if (c.weight_memory_share) j["weight_memory_share"] = *c.weight_memory_share;
    return j;
  };
  nlohmann::json json;
  if (model.stages.size() == 1 && !model.stages.front().weight_memory_share) {
    json = stage_json(model.stages.front());
  } else {
    json["stages"] = nlohmann::json::array();
    for (const StageCost& c : model.stages) json["stages"].push_back(stage_json(c));
  }
  json["comm_latency"] = model.comm_latency;
  json["weight_memory_share"] = model.weight_memory_share;
  if (model.hasOverheads()) {
    json["send_overhead"] = model.send_overhead;
    json["recv_overhead"] = model.recv_overhead;
    json["action_overhead"] = model.action_overhead;
  }
  return json;
}

std::string describeCostModel(const CostModel& model) {
  const std::string overheads =
      model.hasOverheads() ? fmt::format(" send={:g} recv={:g} action={:g}", model.send_overhead,
                                         model.recv_overhead, model.action_overhead)
                           : "";
  if (model.stages.size() == 1) {
    const StageCost& c = model.stages.front();
    return fmt::format("F={:g} I={:g} W={:g} B={:g} comm={:g}{}", c.forward, c.backward_input,
                       c.backward_weight, c.fullBackward(), model.comm_latency, overheads);
  }
  return fmt::format("per-stage costs ({} stages), comm={:g}{}", model.stages.size(),
                     model.comm_latency, overheads);
}

}  // namespace pipeforge::schedules
