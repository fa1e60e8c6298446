#include "train/auto_schedule_pick.h"

#include <algorithm>

#include <ATen/ATen.h>

#include <fmt/format.h>

#include "common/byte_size.h"
#include "common/error.h"
#include "data/dataset.h"
#include "runtime/pipeline_runner.h"
#include "train/model_state.h"
#include "train/rank_checkpoint.h"
#include "train/runner_options.h"
#include "train/schedule_profile.h"

namespace pipeforge::train {
namespace {

struct StageMeasurements {
  std::vector<double> times;   // medianActionTimes
  std::vector<double> memory;  // medianActionMemory
  ActionOverheads overheads;   // medianOverheads
};

// Each stage's median action times and memory over the timed runs, on this rank.
StageMeasurements profileStages(runtime::PipelineRunner& runner, const Batch& batch, int num_stages,
                                const runtime::LossScaling& scaling) {
  constexpr int kWarmUpRuns = 1, kTimedRuns = 2;
  std::vector<runtime::StepProfile> timed;
  for (int run = 0; run < kWarmUpRuns + kTimedRuns; ++run) {
    try {
      runner.trainStep(batch.inputs, batch.targets, scaling);  // the run's own loss (a counting module's too)
    } catch (...) {
      rethrowWithContext("profiling the stages for pipeline.schedule auto");
    }
    runner.zeroGrad();
    if (run >= kWarmUpRuns) timed.push_back(runner.lastProfile());
  }
  return {medianActionTimes(timed, num_stages), medianActionMemory(timed, num_stages), medianOverheads(timed)};
}

// The element-wise sum of `values` over all ranks.
std::vector<double> sumOverRanks(runtime::PipelineRunner& runner, const std::vector<double>& values) {
  at::Tensor sum = at::zeros({static_cast<std::int64_t>(values.size())}, at::kDouble);
  auto t = sum.accessor<double, 1>();
  for (std::size_t k = 0; k < values.size(); ++k) t[k] = values[k];
  runner.allreduceSumAll(sum);
  return std::vector<double>(sum.data_ptr<double>(), sum.data_ptr<double>() + sum.numel());
}

// Note [Memory headroom]: the search keeps the simulated peak this share
// under what the limit leaves for activations. The memory model is checked
// to 10% of the measured peak (tests/train/test_memory_aware_auto.py); what
// it does not see is small but real: a send freed a little later than its
// action, a same-rank handoff (the V's turn) that the producing stage holds
// until its own backward, an action's temporaries above their median.
constexpr double kMemoryHeadroom = 0.1;

std::string noScheduleFitsMessage(const TrainConfig& config, const NoScheduleFits& e, double model_state) {
  const double limit = *config.pipeline.memory_limit;
  return fmt::format(
      "pipeline.memory_limit {}: no schedule fits. A rank's parameters, gradients and optimizer state take up to {}, "
      "and the smallest activation peak any schedule can have is {} ({} layout: one microbatch's activations on "
      "every stage of a rank, what an I keeps for W and an action's temporaries, measured), {} in all with the {:.0f}% of headroom auto "
      "keeps (Note [Memory headroom]). Raise the limit to at least that, use more microbatches "
      "(pipeline.microbatches: each holds fewer activations), recompute them "
      "(pipeline.activation_checkpointing: full), or spread the model over more pipeline ranks or "
      "pipeline.stages_per_rank",
      formatByteSize(limit), formatByteSize(model_state), formatByteSize(e.smallest_peak), layoutName(e.layout),
      formatByteSize(model_state + e.smallest_peak / (1.0 - kMemoryHeadroom)), 100.0 * kMemoryHeadroom);
}

}  // namespace

AutoChoice pickAutoSchedule(runtime::PipelineRunner& runner, const Batch& batch, const TrainConfig& config,
                            int pipeline_ranks, int num_stages, int world_size) {
  const at::Tensor rng = cpuGeneratorState();
  const StageMeasurements measured = profileStages(runner, batch, num_stages, lossScalingFor(config, batch));
  // One allreduce: replica 0's times and memory, then every rank's model state.
  std::vector<double> mine = measured.times;
  mine.insert(mine.end(), measured.memory.begin(), measured.memory.end());
  if (runner.dpRank() != 0) mine.assign(mine.size(), 0.0);  // replica 0's measurements only
  const std::size_t measurements = mine.size();
  // Then every rank's model state, and replica 0's ranks' overheads (three each).
  const std::size_t overheads_at = measurements + static_cast<std::size_t>(world_size);
  mine.resize(overheads_at + 3 * static_cast<std::size_t>(world_size), 0.0);
  if (runner.dpRank() == 0) {
    const std::size_t at = overheads_at + 3 * static_cast<std::size_t>(runner.rank());
    mine[at] = measured.overheads.send_ms;
    mine[at + 1] = measured.overheads.recv_ms;
    mine[at + 2] = measured.overheads.action_ms;
  }
  const ModelStateBytes state =
      estimateModelState(runner.rank(), runner.parameters(), config.optimizer.name, config.optimizer.momentum,
                         config.pipeline.zero_stage, config.pipeline.data_parallel);
  mine[measurements + static_cast<std::size_t>(runner.rank())] = static_cast<double>(state.total());
  const std::vector<double> all = sumOverRanks(runner, mine);
  const std::vector<double> times(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(measured.times.size()));
  const std::vector<double> memory(all.begin() + static_cast<std::ptrdiff_t>(measured.times.size()),
                                   all.begin() + static_cast<std::ptrdiff_t>(measurements));
  const double model_state = *std::max_element(all.begin() + static_cast<std::ptrdiff_t>(measurements),
                                                all.begin() + static_cast<std::ptrdiff_t>(overheads_at));
  // Note [Action overheads]: the mean over the ranks that had any.
  double overhead[3] = {0.0, 0.0, 0.0};
  for (int k = 0; k < 3; ++k) {
    int ranks = 0;
    for (int r = 0; r < world_size; ++r) {
      const double v = all[overheads_at + 3 * static_cast<std::size_t>(r) + static_cast<std::size_t>(k)];
      if (v > 0.0) {
        overhead[k] += v;
        ++ranks;
      }
    }
    if (ranks > 0) overhead[k] /= ranks;
  }

  ScheduleChoiceRequest request;
  request.num_ranks = pipeline_ranks;
  request.stages_per_rank = config.pipeline.stages_per_rank;
  request.num_microbatches = config.pipeline.microbatches;
  request.costs = costModelFromMeasurements(times, memory, num_stages);
  request.costs.send_overhead = overhead[0];
  request.costs.recv_overhead = overhead[1];
  request.costs.action_overhead = overhead[2];
  request.stage_temporaries = stageTemporaries(memory, num_stages);
  if (config.pipeline.memory_limit) {
    request.memory_limit = (*config.pipeline.memory_limit - model_state) * (1.0 - kMemoryHeadroom);
  }
  ScheduleChoice choice;
  try {
    choice = chooseSchedule(request);
  } catch (const NoScheduleFits& e) {
    throw Error(ErrorCode::kUserInput, noScheduleFitsMessage(config, e, model_state));
  }

  std::vector<double> digests(world_size, 0.0);
  digests[runner.rank()] = static_cast<double>(programDigest(choice.program));
  digests = sumOverRanks(runner, digests);
  checkSameProgram(digests);
  runner.setProgram(choice.program);
  runner.setProfiling(config.trace);
  setCpuGeneratorState(rng);
  return AutoChoice{std::move(choice), request.costs, static_cast<std::uint32_t>(digests[0]), model_state,
                    config.pipeline.memory_limit};
}

void checkSameProgram(const std::vector<double>& d) {
  for (std::size_t r = 1; r < d.size(); ++r) {
    if (d[r] != d[0]) {
      throw Error(ErrorCode::kInternal,
                  fmt::format("pipeline.schedule auto: rank {} chose another program than rank 0 (digest {:08x} vs "
                              "{:08x}) from the same costs; this is a bug, please report it; name a schedule in "
                              "pipeline.schedule meanwhile",
                              r, static_cast<std::uint32_t>(d[r]), static_cast<std::uint32_t>(d[0])));
    }
  }
}

}  // namespace pipeforge::train
