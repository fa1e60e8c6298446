// Rank 0's account of a run: the banner at its start and the summary at its
// end on the trainer's output, one metrics.jsonl record per event, and the
// progress bar. Torch-free: the trainer hands it numbers, it words them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/train_config.h"
#include "train/loss_scaler.h"
#include "train/metrics_log.h"
#include "train/model_state.h"
#include "train/progress_bar.h"
#include "train/schedule_choice.h"
#include "train/step_outcome.h"
#include "train/trainer.h"

namespace pipeforge::train {

// What the start banner and the start event tell.
struct RunStart {
  std::int64_t first_step = 0;  // after a resume, the checkpoint's step
  std::int64_t end = 0;         // the run stops after this many steps
  int world_size = 1;
  int num_stages = 1;
  std::string data;  // Dataset::describe()
  // Under activation checkpointing every_n: this rank's recomputed calls
  // (PipelineRunner::recomputedCalls).
  std::vector<std::string> recomputed_calls;
  std::string resumed_from;              // the checkpoint folder; empty: a fresh start
  const LossScaler* scaler = nullptr;    // fp16 only
  const AutoChoice* auto_choice = nullptr;  // pipeline.schedule auto only
};

// One logged training step.
struct TrainRecord {
  std::int64_t done = 0;  // steps done
  double loss = 0.0;      // the mean over replicas
  double lr = 0.0;
  double step_s = 0.0;  // mean step time since the last record
  double eta_s = 0.0;
  double grad_norm = 0.0;            // before clipping
  std::optional<double> loss_scale;  // fp16: the scale this step's backward ran with
  std::optional<std::int64_t> tokens;            // data.packing: none: the global batch's counted targets
  std::vector<std::int64_t> microbatch_lengths;  // ... and replica 0's microbatch lengths
};

class RunReport {
 public:
  // Creates output.dir, appends to its metrics.jsonl, prints the banner
  // (and writes auto_schedule.csv for pipeline.schedule auto), and records
  // the start event. Writes to options.out, or std::cout when unset; the bar
  // redraws in place only on a terminal std::cout.
  RunReport(const TrainConfig& config, const TrainerOptions& options, const RunStart& start);

  void trained(const TrainRecord& record);
  void evaluated(std::int64_t done, double loss);
  // Updates dropped by the step's checks (Note [Non-finite steps]);
  // `loss_scale`: the scale that step's backward ran with.
  void overflowed(std::int64_t done, double loss_scale, const NonFinite& bad, const StepOutcomePolicy& policy);
  void skipped(std::int64_t done, const NonFinite& bad, const StepOutcomePolicy& policy);
  void checkpointed(std::int64_t done, const std::string& dir);
  // One rank's model_state record (train/model_state.h), kept for the summary.
  void modelState(const ModelStateBytes& bytes);
  // Every rank's measured peak activation memory over the run (Note
  // [Activation memory] in runtime/schedule_executor.cpp), by rank, and each
  // rank's pipeline rank: an `activation_memory` record per rank, with auto's
  // simulated peak and what the limit left for activations, and one line.
  // `device_peaks`: each rank's torch.cuda.max_memory_allocated on a GPU
  // (max_memory_allocated_mib in its record), -1 on the CPU.
  void activationMemory(const std::vector<std::int64_t>& peak_bytes, const std::vector<int>& pipeline_rank,
                        const std::vector<std::int64_t>& device_peaks, const AutoChoice* auto_choice);

  // Ends the bar and prints the summary: losses, dropped updates, where the
  // checkpoint, the metrics and the trace (`trace_path`, empty: none) are.
  void finish(const TrainSummary& summary, const LossScaler* scaler, const std::string& model_source,
              const std::string& trace_path);

 private:
  void printBanner(const RunStart& start);
  nlohmann::json reportAutoSchedule(const AutoChoice& a);

  const TrainConfig& config_;
  const TrainerOptions& options_;
  std::ostream& out_;
  std::unique_ptr<MetricsLog> metrics_;
  std::vector<ModelStateBytes> model_state_;
  std::unique_ptr<ProgressBar> progress_;
};

}  // namespace pipeforge::train
