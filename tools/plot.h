// `pipeforge plot`: a run's metrics.jsonl (train/metrics_log.h) drawn as one
// dependency-free SVG of stacked panels: loss (train and held-out), learning
// rate, throughput and gradient norm. Torch-free.
//
//   MetricsSeries m = readMetricsLog("out/run/metrics.jsonl");
//   std::string svg = metricsSvg(m);
#pragma once

#include <string>
#include <vector>

#include "common/error.h"

namespace pipeforge::train {

class PlotError : public pipeforge::Error {
 public:
  explicit PlotError(const std::string& message, ErrorCode code = ErrorCode::kUserInput) : Error(code, message) {}
};

struct MetricPoint {
  double step = 0.0;
  double value = 0.0;
};

// The series of a metrics log, each sorted by step.
struct MetricsSeries {
  std::vector<MetricPoint> train_loss;  // "train" events' "loss"
  std::vector<MetricPoint> eval_loss;   // "eval" events' "loss"
  std::vector<MetricPoint> lr;          // "train" events' "lr"
  std::vector<MetricPoint> throughput;  // "train" events' "tokens_per_s" or "rows_per_s"
  std::vector<MetricPoint> grad_norm;   // "train" events' "grad_norm", when logged
  // "tokens/s", "rows/s", both joined by ", " when a log has both, or empty.
  std::string throughput_unit;
  int lines = 0;  // non-empty lines read
};

// Parses JSON Lines text; `origin` names it in messages ("run/metrics.jsonl").
// Throws PlotError naming origin:line for a line that is not a JSON object, a
// "train"/"eval" event without a numeric "step", and a log without any
// "train" event.
MetricsSeries parseMetricsLog(const std::string& text, const std::string& origin);
MetricsSeries readMetricsLog(const std::string& path);

struct PlotOptions {
  std::string title;          // drawn above the panels; empty: none
  double panel_width = 720;   // the whole drawing's width, in SVG units
  double panel_height = 230;  // each panel's height, title and axis labels included
};

// The SVG document, byte-identical for the same series and options.
std::string metricsSvg(const MetricsSeries& series, const PlotOptions& options = {});

}  // namespace pipeforge::train
