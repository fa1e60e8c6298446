#include "train/auto_schedule_pick.h"

#include <ATen/ATen.h>

#include <fmt/format.h>

#include "common/error.h"
#include "data/dataset.h"
#include "runtime/pipeline_runner.h"
#include "train/rank_checkpoint.h"
#include "train/runner_options.h"
#include "train/schedule_profile.h"

namespace pipeforge::train {
namespace {

// Each stage's median action times over the timed runs, on this rank.
std::vector<double> profileStages(runtime::PipelineRunner& runner, const Batch& batch, int num_stages,
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
  return medianActionTimes(timed, num_stages);
}

// The element-wise sum of `values` over all ranks.
std::vector<double> sumOverRanks(runtime::PipelineRunner& runner, const std::vector<double>& values) {
  at::Tensor sum = at::zeros({static_cast<std::int64_t>(values.size())}, at::kDouble);
  auto t = sum.accessor<double, 1>();
  for (std::size_t k = 0; k < values.size(); ++k) t[k] = values[k];
  runner.allreduceSumAll(sum);
  return std::vector<double>(sum.data_ptr<double>(), sum.data_ptr<double>() + sum.numel());
}

}  // namespace

AutoChoice pickAutoSchedule(runtime::PipelineRunner& runner, const Batch& batch, const TrainConfig& config,
                            int pipeline_ranks, int num_stages, int world_size) {
  const at::Tensor rng = cpuGeneratorState();
  std::vector<double> mine = profileStages(runner, batch, num_stages, lossScalingFor(config, batch));
  if (runner.dpRank() != 0) mine.assign(mine.size(), 0.0);  // replica 0's times only
  const std::vector<double> all = sumOverRanks(runner, mine);

  ScheduleChoiceRequest request;
  request.num_ranks = pipeline_ranks;
  request.stages_per_rank = config.pipeline.stages_per_rank;
  request.num_microbatches = config.pipeline.microbatches;
  request.costs = costModelFromTimes(all, num_stages);
  ScheduleChoice choice = chooseSchedule(request);

  std::vector<double> digests(world_size, 0.0);
  digests[runner.rank()] = static_cast<double>(programDigest(choice.program));
  digests = sumOverRanks(runner, digests);
  checkSameProgram(digests);
  runner.setProgram(choice.program);
  runner.setProfiling(config.trace);
  setCpuGeneratorState(rng);
  return AutoChoice{std::move(choice), request.costs, static_cast<std::uint32_t>(digests[0])};
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
