#include "train/schedule_profile.h"

#include <algorithm>
#include <tuple>
#include <map>

#include "schedules/lower.h"

namespace pipeforge::train {
namespace {

namespace sch = pipeforge::schedules;

sch::Action action(int stage, sch::ActionType type, int microbatch) {
  sch::Action a;
  a.stage = stage;
  a.type = type;
  a.microbatch = microbatch;
  return a;
}

int timedKind(sch::ActionType type) {
  switch (type) {
    case sch::ActionType::kForward: return static_cast<int>(TimedKind::kForward);
    case sch::ActionType::kBackwardInput: return static_cast<int>(TimedKind::kBackwardInput);
    case sch::ActionType::kBackwardWeight: return static_cast<int>(TimedKind::kBackwardWeight);
    case sch::ActionType::kFullBackward: return static_cast<int>(TimedKind::kFullBackward);
    case sch::ActionType::kUnshard:
    case sch::ActionType::kReshard:
    case sch::ActionType::kSendF:
    case sch::ActionType::kRecvF:
    case sch::ActionType::kSendB:
    case sch::ActionType::kRecvB:
    case sch::ActionType::kReduceGrad:
    case sch::ActionType::kOverlapFB: return -1;
  }
  return -1;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Seconds `step` spent posting sends (their spans lie inside it).
double sendsInside(const runtime::StepProfile& profile, const runtime::TimedStep& step) {
  double s = 0.0;
  for (const runtime::TimedSpan& span : profile.spans) {
    if (span.kind == runtime::SpanKind::kSend && span.start_s >= step.start_s && span.end_s <= step.end_s) {
      s += span.end_s - span.start_s;
    }
  }
  return s;
}

bool insideSomeAction(const runtime::StepProfile& profile, const runtime::TimedSpan& span) {
  for (const runtime::TimedStep& step : profile.steps) {
    if (span.start_s >= step.start_s && span.end_s <= step.end_s) return true;
  }
  return false;
}

}  // namespace

ActionOverheads medianOverheads(const std::vector<runtime::StepProfile>& profiles) {
  std::vector<double> sends, recvs, between;
  for (const runtime::StepProfile& profile : profiles) {
    double outside = profile.step_s;
    int compute = 0;
    for (const runtime::TimedStep& step : profile.steps) {
      outside -= step.end_s - step.start_s;
      if (step.action.type == sch::ActionType::kRecvF || step.action.type == sch::ActionType::kRecvB) {
        recvs.push_back(1e3 * std::max(0.0, step.end_s - step.start_s - step.wait_s));
      }
      if (timedKind(step.action.type) >= 0) ++compute;
    }
    for (const runtime::TimedSpan& span : profile.spans) {
      if (span.kind == runtime::SpanKind::kSend) sends.push_back(1e3 * (span.end_s - span.start_s));
      if (!insideSomeAction(profile, span)) outside -= span.end_s - span.start_s;
    }
    if (compute > 0) between.push_back(1e3 * std::max(0.0, outside) / compute);
  }
  ActionOverheads o;
  if (!sends.empty()) o.send_ms = median(sends);
  if (!recvs.empty()) o.recv_ms = median(recvs);
  if (!between.empty()) o.action_ms = median(between);
  return o;
}

sch::Program profilingProgram(int num_ranks, int stages_per_rank, int num_microbatches) {
  sch::Program program;
  program.num_ranks = num_ranks;
  program.num_stages = num_ranks * stages_per_rank;
  program.num_microbatches = num_microbatches;
  program.stage_to_rank = sch::makeStageToRank(num_ranks, program.num_stages, sch::StageLayout::kLoop);
  program.actions.resize(num_ranks);
  auto add = [&](int stage, sch::ActionType type, int mb) {
    program.actions[program.stage_to_rank[stage]].push_back(action(stage, type, mb));
  };
  for (int mb = 0; mb < num_microbatches; ++mb) {
    const bool split = mb % 2 == 1;
    for (int s = 0; s < program.num_stages; ++s) add(s, sch::ActionType::kForward, mb);
    for (int s = program.num_stages - 1; s >= 0; --s) {
      add(s, split ? sch::ActionType::kBackwardInput : sch::ActionType::kFullBackward, mb);
    }
    if (!split) continue;
    for (int s = program.num_stages - 1; s >= 0; --s) add(s, sch::ActionType::kBackwardWeight, mb);
  }
  return sch::addSendRecv(program);
}

std::vector<double> medianActionTimes(const std::vector<runtime::StepProfile>& profiles, int num_stages) {
  std::vector<std::vector<double>> samples(static_cast<std::size_t>(num_stages) * kTimedKinds);
  for (const runtime::StepProfile& profile : profiles) {
    for (const runtime::TimedStep& step : profile.steps) {
      const int kind = timedKind(step.action.type);
      if (kind < 0 || step.action.stage < 0 || step.action.stage >= num_stages) continue;
      const double sends = sendsInside(profile, step);
      const double ms = 1e3 * std::max(0.0, step.end_s - step.start_s - step.wait_s - sends);
      samples[static_cast<std::size_t>(step.action.stage) * kTimedKinds + kind].push_back(ms);
    }
  }
  std::vector<double> times(samples.size(), 0.0);
  for (std::size_t k = 0; k < samples.size(); ++k) {
    if (!samples[k].empty()) times[k] = median(samples[k]);
  }
  return times;
}

std::vector<double> medianActionMemory(const std::vector<runtime::StepProfile>& profiles, int num_stages) {
  std::vector<std::vector<double>> samples(static_cast<std::size_t>(num_stages) * kTimedKinds);
  std::vector<std::vector<double>> temporaries(samples.size());
  for (const runtime::StepProfile& profile : profiles) {
    // (stage, microbatch, kind) -> change, RECV_F counted with its F and
    // RECV_B with the I or B that consumes the gradient.
    std::map<std::tuple<int, int, int>, double> change;
    std::map<std::pair<int, int>, int> backward_kind;
    for (const runtime::TimedStep& step : profile.steps) {
      const int kind = timedKind(step.action.type);
      if (kind == static_cast<int>(TimedKind::kBackwardInput) || kind == static_cast<int>(TimedKind::kFullBackward)) {
        backward_kind[{step.action.stage, step.action.microbatch.value_or(-1)}] = kind;
      }
    }
    for (const runtime::TimedStep& step : profile.steps) {
      const int s = step.action.stage, mb = step.action.microbatch.value_or(-1);
      if (s < 0 || s >= num_stages) continue;
      int kind = timedKind(step.action.type);
      if (step.action.type == sch::ActionType::kRecvF) kind = static_cast<int>(TimedKind::kForward);
      if (step.action.type == sch::ActionType::kRecvB) {
        auto it = backward_kind.find({s, mb});
        kind = it == backward_kind.end() ? -1 : it->second;
      }
      if (kind < 0) continue;
      change[{s, mb, kind}] += static_cast<double>(step.memory_delta);
    }
    for (const auto& [key, delta] : change) {
      const auto& [s, mb, kind] = key;
      const double bytes = kind == static_cast<int>(TimedKind::kForward) ? delta : -delta;
      samples[static_cast<std::size_t>(s) * kTimedKinds + kind].push_back(bytes);
    }
    for (const runtime::TimedStep& step : profile.steps) {
      const int s = step.action.stage, kind = timedKind(step.action.type);
      if (s < 0 || s >= num_stages || kind < 0) continue;
      const double above = static_cast<double>(step.memory_peak - std::max<std::int64_t>(step.memory_delta, 0));
      temporaries[static_cast<std::size_t>(s) * kTimedKinds + kind].push_back(above);
    }
  }
  std::vector<double> bytes(samples.size() + static_cast<std::size_t>(num_stages), 0.0);
  for (std::size_t k = 0; k < samples.size(); ++k) {
    if (!samples[k].empty()) bytes[k] = median(samples[k]);
    double& temporary = bytes[samples.size() + k / kTimedKinds];
    if (!temporaries[k].empty()) temporary = std::max(temporary, median(temporaries[k]));
  }
  return bytes;
}

sch::CostModel costModelFromMeasurements(const std::vector<double>& times, const std::vector<double>& memory,
                                         int num_stages) {
  sch::CostModel model = costModelFromTimes(times, num_stages);
  auto at = [&](int stage, TimedKind kind) {
    const std::size_t k = static_cast<std::size_t>(stage) * kTimedKinds + static_cast<int>(kind);
    return k < memory.size() ? memory[k] : 0.0;
  };
  for (int s = 0; s < num_stages; ++s) {
    sch::StageCost& cost = model.stages[s];
    cost.activation_memory = std::max(0.0, at(s, TimedKind::kForward));
    // I releases the rest of what F kept: negative (I allocates) when W
    // frees more than F kept, the gradients I left for W among it.
    const double w = std::max(0.0, at(s, TimedKind::kBackwardWeight));
    const bool split_measured = at(s, TimedKind::kBackwardInput) != 0.0 || w != 0.0;
    if (split_measured && cost.activation_memory > 0.0) cost.weight_memory_share = w / cost.activation_memory;
  }
  return model;
}

std::vector<double> stageTemporaries(const std::vector<double>& memory, int num_stages) {
  const std::size_t first = static_cast<std::size_t>(num_stages) * kTimedKinds;
  std::vector<double> out(static_cast<std::size_t>(num_stages), 0.0);
  for (std::size_t s = 0; s < out.size() && first + s < memory.size(); ++s) out[s] = std::max(0.0, memory[first + s]);
  return out;
}

sch::CostModel costModelFromTimes(const std::vector<double>& times, int num_stages) {
  sch::CostModel model;
  model.stages.clear();
  model.comm_latency = 0.0;
  auto at = [&](int stage, TimedKind kind) {
    const std::size_t k = static_cast<std::size_t>(stage) * kTimedKinds + static_cast<int>(kind);
    return k < times.size() ? times[k] : 0.0;
  };
  for (int s = 0; s < num_stages; ++s) {
    sch::StageCost cost;
    double f = at(s, TimedKind::kForward);
    double i = at(s, TimedKind::kBackwardInput);
    double w = at(s, TimedKind::kBackwardWeight);
    double b = at(s, TimedKind::kFullBackward);
    if (i <= 0.0 || w <= 0.0) i = w = 0.5 * b;
    if (b <= 0.0) b = i + w;
    cost.forward = std::max(f, kMinActionMs);
    cost.backward_input = std::max(i, kMinActionMs);
    cost.backward_weight = std::max(w, kMinActionMs);
    cost.full_backward = std::max(b, kMinActionMs);
    cost.activation_memory = 1.0;
    model.stages.push_back(cost);
  }
  return model;
}

}  // namespace pipeforge::train
