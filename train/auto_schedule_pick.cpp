#include "train/auto_schedule_pick.h"

#include <algorithm>
#include <iterator>

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

// What the ranks pool for the search, in one allreduce: the same sizes on
// every rank, each entry filled in by the one rank that owns it (or by the
// ranks of replica 0, each its own slot) and zero elsewhere, so that every
// sum is bitwise one rank's number.
struct PooledMeasurements {
  std::vector<double> times;        // per stage and action (medianActionTimes): replica 0's
  std::vector<double> memory;       // per stage (medianActionMemory): replica 0's
  std::vector<double> model_state;  // per stage (estimateModelState): replica 0's, tensor-parallel rank 0's
  std::vector<double> overheads;    // per rank: send, receive, action (medianOverheads); replica 0's

  std::vector<double> pack() const {
    std::vector<double> out;
    for (const std::vector<double>* part : {&times, &memory, &model_state, &overheads}) {
      out.insert(out.end(), part->begin(), part->end());
    }
    return out;
  }
  // Reads back what pack() wrote on a rank with the same sizes.
  void unpack(const std::vector<double>& packed) {
    auto at = packed.begin();
    for (std::vector<double>* part : {&times, &memory, &model_state, &overheads}) {
      std::copy(at, at + static_cast<std::ptrdiff_t>(part->size()), part->begin());
      at += static_cast<std::ptrdiff_t>(part->size());
    }
  }
};

// Note [Memory headroom]: the search keeps the simulated peak this share
// under what the limit leaves for activations. The memory model is checked
// to 10% of the measured peak (tests/train/test_memory_aware_auto.py); what
// it does not see is small but real: a send freed a little later than its
// action, a same-rank handoff (the V's turn) that the producing stage holds
// until its own backward, an action's temporaries above their median.
constexpr double kMemoryHeadroom = 0.1;

std::string noScheduleFitsMessage(const TrainConfig& config, const NoScheduleFits& e) {
  const double limit = *config.pipeline.memory_limit;
  return fmt::format(
      "pipeline.memory_limit {}: no schedule fits. A rank's parameters, gradients and optimizer state take up to {}, "
      "and the smallest activation peak any schedule can have is {} ({} layout: one microbatch's activations on "
      "every stage of a rank, what an I keeps for W and an action's temporaries, measured), {} in all with the {:.0f}% of headroom auto "
      "keeps (Note [Memory headroom]). Raise the limit to at least that, use more microbatches "
      "(pipeline.microbatches: each holds fewer activations), recompute them "
      "(pipeline.activation_checkpointing: full), or spread the model over more pipeline ranks or "
      "pipeline.stages_per_rank",
      formatByteSize(limit), formatByteSize(e.model_state), formatByteSize(e.smallest_peak), layoutName(e.layout),
      formatByteSize(e.least_limit), 100.0 * kMemoryHeadroom);
}

}  // namespace

AutoChoice pickAutoSchedule(runtime::PipelineRunner& runner, const Batch& batch, const TrainConfig& config,
                            int pipeline_ranks, int num_stages, int world_size) {
  const at::Tensor rng = cpuGeneratorState();
  const StageMeasurements measured = profileStages(runner, batch, num_stages, lossScalingFor(config, batch));
  PooledMeasurements pool{measured.times, measured.memory, std::vector<double>(num_stages, 0.0),
                          std::vector<double>(3 * static_cast<std::size_t>(world_size), 0.0)};
  if (runner.dpRank() != 0) {
    std::fill(pool.times.begin(), pool.times.end(), 0.0);
    std::fill(pool.memory.begin(), pool.memory.end(), 0.0);
  } else {
    const std::size_t at = 3 * static_cast<std::size_t>(runner.rank());
    pool.overheads[at] = measured.overheads.send_ms;
    pool.overheads[at + 1] = measured.overheads.recv_ms;
    pool.overheads[at + 2] = measured.overheads.action_ms;
  }
  // Note [Memory-aware auto]: model state per stage, so that each layout
  // sums its own ranks' (the V holds other stages together than the loop).
  if (runner.dpRank() == 0 && runner.tpRank() == 0) {
    const std::vector<runtime::NamedTensor> params = runner.parameters();
    for (int stage : runner.localStages()) {
      std::vector<runtime::NamedTensor> mine;
      std::copy_if(params.begin(), params.end(), std::back_inserter(mine),
                   [stage](const runtime::NamedTensor& p) { return p.stage == stage; });
      const ModelStateBytes state =
          estimateModelState(runner.rank(), mine, config.optimizer.name, config.optimizer.momentum,
                             config.pipeline.zero_stage, config.pipeline.data_parallel);
      pool.model_state.at(static_cast<std::size_t>(stage)) = static_cast<double>(state.total());
    }
  }
  pool.unpack(sumOverRanks(runner, pool.pack()));
  // Note [Action overheads]: the mean over the ranks that had any.
  double overhead[3] = {0.0, 0.0, 0.0};
  for (std::size_t k = 0; k < 3; ++k) {
    int ranks = 0;
    for (std::size_t r = 0; r < static_cast<std::size_t>(world_size); ++r) {
      const double v = pool.overheads[3 * r + k];
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
  request.costs = costModelFromMeasurements(pool.times, pool.memory, num_stages);
  request.costs.send_overhead = overhead[0];
  request.costs.recv_overhead = overhead[1];
  request.costs.action_overhead = overhead[2];
  request.stage_temporaries = stageTemporaries(pool.memory, num_stages);
  request.memory_limit = config.pipeline.memory_limit;
  request.stage_model_state = pool.model_state;
  request.memory_headroom = kMemoryHeadroom;
  ScheduleChoice choice;
  try {
    choice = chooseSchedule(request);
  } catch (const NoScheduleFits& e) {
    throw Error(ErrorCode::kUserInput, noScheduleFitsMessage(config, e));
  }

  std::vector<double> digests(world_size, 0.0);
  digests[runner.rank()] = static_cast<double>(programDigest(choice.program));
  digests = sumOverRanks(runner, digests);
  checkSameProgram(digests);
  runner.setProgram(choice.program);
  runner.setProfiling(config.trace);
  setCpuGeneratorState(rng);
  const double model_state = choice.model_state;
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
