#include "train/deferred_reports.h"

#include <fmt/format.h>

namespace pipeforge::train {

std::string lossKey(std::int64_t done) { return fmt::format("loss/{}", done); }

std::string evalKey(std::int64_t done, std::int64_t batch) { return fmt::format("eval/{}/{}", done, batch); }

DeferredReports::DeferredReports(const TrainConfig& config, RankChannel& channel, RunReport* report)
    : config_(config), channel_(channel), report_(report) {}

void DeferredReports::drain(std::size_t count, TrainSummary& summary) {
  if (report_ == nullptr) {
    pending_.clear();
    return;
  }
  for (; count > 0 && !pending_.empty(); --count) {
    const PendingReport r = pending_.front();
    pending_.pop_front();
    if (r.eval) {
      double sum = 0.0;
      for (std::int64_t k = 0; k < config_.eval_batches; ++k) sum += takeLoss(evalKey(r.done, k));
      const double loss = sum / static_cast<double>(config_.eval_batches);
      report_->evaluated(r.done, loss);
      summary.last_eval_loss = loss;
      continue;
    }
    const double loss = takeLoss(lossKey(r.done));
    report_->trained(TrainRecord{r.done, loss, r.lr, r.step_s, r.eta_s, r.grad_norm, r.loss_scale, r.tokens,
                                 r.microbatch_lengths});
    if (!summary.first_loss) summary.first_loss = loss;
    summary.last_loss = loss;
  }
}

double DeferredReports::takeLoss(const std::string& key) {
  double sum = 0.0;
  for (int d = 0; d < config_.pipeline.data_parallel; ++d) {
    sum += channel_.takeNumber(fmt::format("{}/{}", key, d));
  }
  return sum / config_.pipeline.data_parallel;
}

}  // namespace pipeforge::train
