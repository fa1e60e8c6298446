#include "train/run_report.h"

#include <filesystem>
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/atomic_file.h"
#include "common/byte_size.h"
#include "compat/cuda_device.h"
#include "mesh/mesh_layout.h"
#include "schedules/csv.h"

namespace pipeforge::train {
namespace {

namespace fs = std::filesystem;

}  // namespace

RunReport::RunReport(const TrainConfig& config, const TrainerOptions& options, const RunStart& start)
    : config_(config), options_(options), out_(options.out != nullptr ? *options.out : std::cout) {
  std::error_code ec;
  fs::create_directories(config_.output_dir, ec);
  metrics_ = std::make_unique<MetricsLog>((fs::path(config_.output_dir) / "metrics.jsonl").string());
  printBanner(start);
  progress_ = std::make_unique<ProgressBar>(out_, config_.steps, options_.out == nullptr && stdoutIsTerminal());
}

void RunReport::printBanner(const RunStart& start) {
  const auto& p = config_.pipeline;
  out_ << fmt::format("pipeforge train: {} ranks = {} pipeline x {}{} data-parallel, {} stages, schedule {}{}, {} "
                      "microbatches, {} steps of {} rows\n",
                      start.world_size,
                      mesh::MeshLayout::fromWorld(start.world_size, p.tensor_parallel, p.data_parallel)
                          .size(mesh::Axis::kPp),
                      p.tensor_parallel > 1 ? fmt::format("{} tensor-parallel x ", p.tensor_parallel) : "",
                      p.data_parallel, start.num_stages,
                      scheduleLabel(config_), p.csv_program ? " (CSV)" : "", p.microbatches, config_.steps,
                      config_.global_batch_size);
  nlohmann::json auto_record;
  if (start.auto_choice != nullptr) auto_record = reportAutoSchedule(*start.auto_choice);
  out_ << "  data: " << start.data << "\n";
  if (config_.precision != PrecisionName::kFp32) {
    out_ << fmt::format("  precision: {} autocast{}\n", precisionName(config_.precision),
                        start.scaler != nullptr
                            ? fmt::format(", loss scale {} (x2 every {} steps without overflow)",
                                          start.scaler->scale(), config_.loss_scale.growth_interval)
                            : std::string());
  }
  if (p.activation_checkpointing == ActivationCheckpointing::kEveryN) {
    // Each stage counts its own calls (Note [Checkpointing every k-th call]).
    out_ << fmt::format("  activation checkpointing every {} calls: {}{}\n", p.checkpoint_every_n,
                        fmt::join(start.recomputed_calls, "; "), start.world_size > 1 ? " (this rank's stages)" : "");
  }
  if (p.activation_checkpointing == ActivationCheckpointing::kMicrobatches) {
    // Note [Partial recompute] in runtime/pipeline_stage.h.
    out_ << fmt::format("  activation checkpointing: each stage keeps the graph of at most {} live {}, and "
                        "recomputes the rest\n",
                        p.checkpoint_microbatches, p.checkpoint_microbatches == 1 ? "microbatch" : "microbatches");
  }
  if (!start.resumed_from.empty()) {
    out_ << fmt::format("  resumed from {} at step {}\n", start.resumed_from, start.first_step);
  }
  if (start.first_step >= start.end) {
    // Name what set the end: --stop-after is an absolute step, not a count from the resume.
    const bool by_option = options_.stop_after && *options_.stop_after < config_.steps;
    out_ << fmt::format("  nothing to train: the checkpoint is at step {} and the run stops at {} ({})\n",
                        start.first_step, start.end,
                        by_option ? fmt::format("--stop-after {} is an absolute step; give one above {}",
                                                *options_.stop_after, start.first_step)
                                  : std::string("raise training.steps, or set checkpoint.resume: false to start over"));
  }
  out_ << std::flush;
  nlohmann::json record = {{"event", "start"},
                           {"step", start.first_step},
                           {"world_size", start.world_size},
                           {"schedule", scheduleLabel(config_)},
                           {"precision", precisionName(config_.precision)},
                           {"resumed_from", start.resumed_from}};
  if (start.auto_choice != nullptr) record["auto_schedule"] = auto_record;
  if (options_.cpu_pinning) {  // Note [One core range per rank]: rank 0's
    record["cpu_affinity"] = {{"cpus", cpuListText(options_.cpu_pinning->cpus)},
                              {"reason", options_.cpu_pinning->reason}};
  }
  metrics_->write(record);
}

// Prints what `auto` chose and the named schedules it was measured against,
// writes the program to <output.dir>/auto_schedule.csv (for
// pipeline.schedule_csv), and returns all of it for the start event.
nlohmann::json RunReport::reportAutoSchedule(const AutoChoice& a) {
  const ScheduleChoice& c = a.choice;
  const std::string csv = (fs::path(config_.output_dir) / "auto_schedule.csv").string();
  writeFileAtomically(csv, schedules::programToCsv(c.program));
  out_ << fmt::format("  schedule auto: {} ({} layout), simulated step {:.4g} ms (lower bound {:.4g} ms), "
                      "activation peak {} per rank{}; written to {}\n",
                      c.origin, layoutName(c.layout), c.makespan, c.lower_bound, formatByteSize(c.peak_memory),
                      a.memory_limit ? fmt::format(" (limit {} less {} of model state)", formatByteSize(*a.memory_limit),
                                                   formatByteSize(a.model_state_bytes))
                                     : std::string(),
                      csv);
  nlohmann::json costs = nlohmann::json::array();
  std::string f, i, w, b, kept;
  for (std::size_t s = 0; s < a.costs.stages.size(); ++s) {
    const schedules::StageCost& sc = a.costs.stages[s];
    kept += fmt::format(" {}", formatByteSize(sc.activation_memory));
    f += fmt::format(" {:.3g}", sc.forward);
    i += fmt::format(" {:.3g}", sc.backward_input);
    w += fmt::format(" {:.3g}", sc.backward_weight);
    b += fmt::format(" {:.3g}", sc.fullBackward());
    costs.push_back({{"stage", s}, {"F", sc.forward}, {"I", sc.backward_input}, {"W", sc.backward_weight},
                     {"B", sc.fullBackward()}, {"activation_bytes", sc.activation_memory},
                     {"weight_memory_share", a.costs.weightMemoryShare(static_cast<int>(s))}});
  }
  out_ << fmt::format("    measured ms per stage: F{} | I{} | W{} | B{}; per message: send {:.3g}, receive {:.3g}; "
                      "per action: {:.3g}\n",
                      f, i, w, b, a.costs.send_overhead, a.costs.recv_overhead, a.costs.action_overhead);
  out_ << fmt::format("    activations a microbatch keeps per stage:{}\n", kept);
  nlohmann::json named = nlohmann::json::array();
  std::string ran, not_run;
  for (const NamedScheduleTime& n : c.named) {
    named.push_back({{"name", n.name},
                     {"simulated_step_ms", n.makespan ? nlohmann::json(*n.makespan) : nlohmann::json()},
                     {"simulated_peak_activation_bytes", n.peak_memory ? nlohmann::json(*n.peak_memory) : nlohmann::json()},
                     {"note", n.note}});
    if (n.makespan) {
      ran += fmt::format("{}{} {:.4g} ms ({:+.1f}%)", ran.empty() ? "" : ", ", n.name, *n.makespan,
                         100.0 * (*n.makespan / c.makespan - 1.0));
    } else {
      not_run += fmt::format("{}{}", not_run.empty() ? "" : ", ", n.name);
    }
  }
  if (!ran.empty()) out_ << "    named schedules, simulated: " << ran << "\n";
  if (!not_run.empty()) out_ << "    not for this job (why: metrics.jsonl): " << not_run << "\n";
  return {{"chosen", c.origin},
          {"layout", layoutName(c.layout)},
          {"simulated_step_ms", c.makespan},
          {"lower_bound_ms", c.lower_bound},
          {"simulated_peak_activation_bytes", c.peak_memory},
          {"simulated_rank_peak_activation_bytes", c.rank_peak_memory},
          {"model_state_bytes", a.model_state_bytes},
          {"memory_limit_bytes", a.memory_limit ? nlohmann::json(*a.memory_limit) : nlohmann::json()},
          {"program_digest", fmt::format("{:08x}", a.digest)},
          {"csv", csv},
          {"measured_ms", costs},
          {"overheads_ms",
           {{"send", a.costs.send_overhead}, {"recv", a.costs.recv_overhead}, {"action", a.costs.action_overhead}}},
          {"named", named}};
}

void RunReport::trained(const TrainRecord& r) {
  // Token data counts tokens; tensor data counts rows, whatever their shape.
  const bool tokens = config_.data.format != DataFormat::kTensors;
  const double rows_per_s = static_cast<double>(config_.global_batch_size) / r.step_s;
  // One document per row (data.packing: none): the tokens the loss counts, padding not.
  const double throughput =
      r.tokens ? static_cast<double>(*r.tokens) / r.step_s : tokens ? rows_per_s * config_.data.block_size : rows_per_s;
  nlohmann::json record{{"event", "train"}, {"step", r.done},           {"loss", r.loss},
                        {"lr", r.lr},       {"grad_norm", r.grad_norm}, {"step_s", r.step_s}};
  record[tokens ? "tokens_per_s" : "rows_per_s"] = throughput;
  if (r.tokens) {
    record["tokens"] = *r.tokens;
    record["seq_lengths"] = r.microbatch_lengths;
  }
  if (r.loss_scale) record["loss_scale"] = *r.loss_scale;
  // On a GPU: torch.cuda.max_memory_allocated of rank 0's device so far (a
  // CPU run has no such figure). Rank 0 is local rank 0, so "cuda" is cuda:0.
  const std::string device = config_.device == "cuda" ? "cuda:0" : config_.device;
  if (auto peak = compat::maxMemoryAllocated(device)) {
    record["max_memory_allocated_mib"] = static_cast<double>(*peak) / (1024.0 * 1024.0);
  }
  metrics_->write(record);
  progress_->update(StepReport{r.done, r.loss, r.lr, throughput, r.eta_s, tokens ? "tok/s" : "rows/s", r.grad_norm});
}

void RunReport::evaluated(std::int64_t done, double loss) {
  metrics_->write({{"event", "eval"}, {"step", done}, {"loss", loss}});
  progress_->note(fmt::format("step {}: held-out loss {:.4f} ({} batches)", done, loss, config_.eval_batches));
}

void RunReport::overflowed(std::int64_t done, double loss_scale, const NonFinite& bad,
                           const StepOutcomePolicy& policy) {
  const double next = policy.scaler()->scale();
  metrics_->write({{"event", "overflow"}, {"step", done}, {"loss_scale", loss_scale}, {"next_loss_scale", next},
                   {"first_stage", bad.first_stage}, {"overflow_steps", policy.overflowSteps()}});
  progress_->note(fmt::format("step {}: gradients overflowed at loss scale {}: update skipped, scale now {} ({} so "
                              "far)",
                              done, loss_scale, next, policy.overflowSteps()));
}

void RunReport::skipped(std::int64_t done, const NonFinite& bad, const StepOutcomePolicy& policy) {
  metrics_->write({{"event", "skipped_step"}, {"step", done}, {"first_stage", bad.first_stage},
                   {"loss_finite", !bad.loss}, {"skipped_steps", policy.skippedSteps()}});
  progress_->note(fmt::format("step {}: update skipped: {} ({} skipped so far)", done, policy.describe(bad),
                              policy.skippedSteps()));
}

void RunReport::checkpointed(std::int64_t done, const std::string& dir) {
  metrics_->write({{"event", "checkpoint"}, {"step", done}, {"dir", dir}});
  progress_->note(fmt::format("step {}: checkpoint {}", done, dir));
}

void RunReport::modelState(const ModelStateBytes& bytes) {
  metrics_->write(modelStateRecord(bytes));
  model_state_.push_back(bytes);
}

void RunReport::activationMemory(const std::vector<std::int64_t>& peaks, const std::vector<int>& pipeline_rank,
                                 const std::vector<std::int64_t>& device_peaks, const AutoChoice* a) {
  std::string line;
  for (std::size_t r = 0; r < peaks.size(); ++r) {
    const int p = pipeline_rank.at(r);
    nlohmann::json record{{"event", "activation_memory"}, {"rank", r}, {"pipeline_rank", p}, {"peak_bytes", peaks[r]}};
    if (r < device_peaks.size() && device_peaks[r] >= 0) {
      record["max_memory_allocated_mib"] = static_cast<double>(device_peaks[r]) / (1024.0 * 1024.0);
    }
    std::string simulated;
    if (a != nullptr && p >= 0 && p < static_cast<int>(a->choice.rank_peak_memory.size())) {
      const double sim = a->choice.rank_peak_memory[p];
      record["simulated_peak_bytes"] = sim;
      simulated = fmt::format(" (simulated {})", formatByteSize(sim));
    }
    if (a != nullptr && a->memory_limit) record["activation_budget_bytes"] = *a->memory_limit - a->model_state_bytes;
    metrics_->write(record);
    line += fmt::format("{}rank {}: {}{}", line.empty() ? "" : ", ", r, formatByteSize(static_cast<double>(peaks[r])),
                        simulated);
  }
  out_ << "  activation memory, measured peak: " << line << "\n";
}

void RunReport::finish(const TrainSummary& s, const LossScaler* scaler, const std::string& model_source,
                       const std::string& trace_path) {
  progress_->finish();
  if (s.first_loss && s.last_loss) {
    out_ << fmt::format("trained steps {}..{} in {:.1f} s: loss {:.4f} -> {:.4f}", s.first_step, s.last_step,
                        s.seconds, *s.first_loss, *s.last_loss);
    if (s.last_eval_loss) out_ << fmt::format(", held-out loss {:.4f}", *s.last_eval_loss);
    if (s.skipped_steps > 0) out_ << fmt::format(", {} updates skipped (non-finite)", s.skipped_steps);
    if (s.overflow_steps > 0) {
      out_ << fmt::format(", {} updates skipped (fp16 overflow; loss scale now {})", s.overflow_steps,
                          scaler->scale());
    }
    out_ << "\n";
  }
  if (!s.checkpoint.empty()) {
    out_ << "  checkpoint: " << s.checkpoint << "\n";
    if (!model_source.empty()) {
      // A .pt2 model exports back to a .pt2 (torch.export.load runs it).
      const bool pt2 = model_source.size() > 4 && model_source.compare(model_source.size() - 4, 4, ".pt2") == 0;
      if (!config_.model.weights.empty()) {
        // Weights from a pretrained checkpoint go back out the same way.
        out_ << fmt::format("  export:     pipeforge export {} --model {} --format safetensors --like {} --out "
                            "finetuned/\n",
                            config_.checkpoint.dir, model_source, config_.model.weights.front());
      } else {
        out_ << fmt::format("  export:     pipeforge export {} --model {} --out trained.{}\n", config_.checkpoint.dir,
                            model_source, pt2 ? "pt2" : "pt");
      }
    }
  }
  for (const ModelStateBytes& b : model_state_) out_ << "  model state " << describeModelState(b) << "\n";
  out_ << "  metrics:    " << metrics_->path() << "\n";
  if (!trace_path.empty()) out_ << "  trace:      " << trace_path << "  (open in https://ui.perfetto.dev)\n";
  out_ << std::flush;
}

}  // namespace pipeforge::train
