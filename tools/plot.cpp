#include "tools/plot.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/svg_text.h"

namespace pipeforge::train {
namespace {

using Json = nlohmann::json;

// Note [Steps logged twice]: a resumed run appends to the same metrics.jsonl
// and logs again the steps between its checkpoint and the interruption. Each
// series keeps one value per step, the one logged last (the resumed run's),
// so the lines never fold back on themselves.
using StepMap = std::map<double, double>;

std::vector<MetricPoint> toPoints(const StepMap& values) {
  std::vector<MetricPoint> out;
  out.reserve(values.size());
  for (const auto& [step, value] : values) out.push_back(MetricPoint{step, value});
  return out;
}

// A field's number, or nothing when absent or null (JSON has no NaN: the log
// writes a non-finite value as null). Anything else is an error.
bool numberField(const Json& record, const char* key, double& out, const std::string& where) {
  auto it = record.find(key);
  if (it == record.end() || it->is_null()) return false;
  if (!it->is_number()) {
    throw PlotError(fmt::format("{}: \"{}\" is {}, not a number; was this line written by `pipeforge train`?", where,
                                key, it->dump()));
  }
  out = it->get<double>();
  return std::isfinite(out);
}

}  // namespace

MetricsSeries parseMetricsLog(const std::string& text, const std::string& origin) {
  StepMap train_loss, eval_loss, lr, throughput, grad_norm;
  bool tokens = false, rows = false;
  int train_events = 0;
  MetricsSeries out;
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ++out.lines;
    const std::string where = fmt::format("{}:{}", origin, number);
    Json record;
    try {
      record = Json::parse(line);
    } catch (const Json::parse_error& e) {
      throw PlotError(fmt::format("{}: not JSON ({}); a metrics log holds one JSON object per line, as `pipeforge "
                                  "train` writes to output.dir/metrics.jsonl",
                                  where, e.what()));
    }
    if (!record.is_object()) {
      throw PlotError(fmt::format("{}: {} is not a JSON object; a metrics log holds one JSON object per line, as "
                                  "`pipeforge train` writes to output.dir/metrics.jsonl",
                                  where, record.dump().substr(0, 60)));
    }
    auto event = record.find("event");
    if (event == record.end() || !event->is_string()) continue;  // not a metric
    const std::string name = event->get<std::string>();
    if (name != "train" && name != "eval") continue;  // start, checkpoint, skipped_step, ...
    double step = 0.0;
    if (!numberField(record, "step", step, where)) {
      throw PlotError(fmt::format("{}: a \"{}\" event without a numeric \"step\"", where, name));
    }
    double v = 0.0;
    if (name == "eval") {
      if (numberField(record, "loss", v, where)) eval_loss[step] = v;
      continue;
    }
    ++train_events;
    if (numberField(record, "loss", v, where)) train_loss[step] = v;
    if (numberField(record, "lr", v, where)) lr[step] = v;
    if (numberField(record, "grad_norm", v, where)) grad_norm[step] = v;
    // Token data logs tokens_per_s; tensor data may log rows_per_s instead.
    if (numberField(record, "tokens_per_s", v, where)) {
      throughput[step] = v;
      tokens = true;
    } else if (numberField(record, "rows_per_s", v, where)) {
      throughput[step] = v;
      rows = true;
    }
  }
  if (train_events == 0) {
    throw PlotError(fmt::format("{}: no \"train\" events in {} line{}; give the metrics.jsonl of a `pipeforge train` "
                                "run that logged at least one step",
                                origin, out.lines, out.lines == 1 ? "" : "s"));
  }
  out.train_loss = toPoints(train_loss);
  out.eval_loss = toPoints(eval_loss);
  out.lr = toPoints(lr);
  out.throughput = toPoints(throughput);
  out.grad_norm = toPoints(grad_norm);
  out.throughput_unit = tokens && rows ? "tokens/s, rows/s" : tokens ? "tokens/s" : rows ? "rows/s" : "";
  return out;
}

MetricsSeries readMetricsLog(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw PlotError(fmt::format("cannot open metrics log '{}': {}; give the metrics.jsonl that `pipeforge train` "
                                "wrote in its output.dir",
                                path, std::strerror(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return parseMetricsLog(text.str(), path);
}

namespace {

// Ticks at 1, 2 or 5 times a power of ten, about `target` of them in [lo, hi].
std::vector<double> niceTicks(double lo, double hi, int target) {
  const double raw = (hi - lo) / std::max(1, target - 1);
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * power;
    if (step >= raw) break;
  }
  std::vector<double> ticks;
  const auto first = static_cast<long long>(std::ceil(lo / step - 1e-9));
  for (long long k = first; k * step <= hi + step * 1e-9; ++k) ticks.push_back(static_cast<double>(k) * step);
  return ticks;
}

std::string tickLabel(double v) {
  if (std::abs(v) < 1e-300) return "0";
  return fmt::format("{:.6g}", v);
}

struct Range {
  double lo = 0.0;
  double hi = 1.0;
};

// The data's span, widened to a visible one when all values are equal.
Range spanOf(const std::vector<const std::vector<MetricPoint>*>& series, bool steps) {
  double lo = INFINITY, hi = -INFINITY;
  for (const auto* s : series) {
    for (const MetricPoint& p : *s) {
      const double v = steps ? p.step : p.value;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  }
  if (lo > hi) return Range{};
  if (hi - lo <= 1e-12 * std::max(std::abs(lo), std::abs(hi))) {
    const double pad = lo == 0.0 ? 1.0 : std::abs(lo) * 0.1;
    return Range{lo - pad, hi + pad};
  }
  if (!steps) {  // a margin, so extreme values do not sit on the frame
    const double pad = (hi - lo) * 0.05;
    return Range{lo - pad, hi + pad};
  }
  return Range{lo, hi};
}

struct Series {
  const char* name;    // the legend's text and the polyline's data-series
  const char* colour;
  const std::vector<MetricPoint>* points;
  bool markers;        // a circle at every point (sparse series)
};

struct Panel {
  std::string title;
  std::string y_label;
  std::vector<Series> series;
  std::string empty_reason;  // shown when no series has a point
};

constexpr double kLeft = 86;    // room for the y tick labels and the axis label
constexpr double kRight = 24;
constexpr double kTitleRow = 30;  // panel title and legend
constexpr double kBottom = 44;    // x tick labels and "step"

class SvgBuilder {
 public:
  SvgBuilder(const PlotOptions& options, Range steps) : options_(options), steps_(steps) {}

  void panel(const Panel& p, double top) {
    const double x0 = kLeft, x1 = options_.panel_width - kRight;
    const double y0 = top + kTitleRow, y1 = top + options_.panel_height - kBottom;
    out_ += fmt::format("<g class=\"panel\" data-title=\"{}\">\n", svgEscape(p.title));
    out_ += fmt::format("<text class=\"panel-title\" x=\"{}\" y=\"{}\" font-size=\"14\" font-weight=\"bold\">{}</text>\n",
                        svgNumber(x0), svgNumber(top + 18), svgEscape(p.title));
    out_ += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#ffffff\" stroke=\"#888888\"/>\n",
                        svgNumber(x0), svgNumber(y0), svgNumber(x1 - x0), svgNumber(y1 - y0));
    std::vector<const std::vector<MetricPoint>*> all;
    for (const Series& s : p.series) {
      if (!s.points->empty()) all.push_back(s.points);
    }
    if (all.empty()) {
      out_ += fmt::format("<text class=\"no-data\" x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"13\" "
                          "fill=\"#666666\">no data: {}</text>\n</g>\n",
                          svgNumber((x0 + x1) / 2), svgNumber((y0 + y1) / 2), svgEscape(p.empty_reason));
      return;
    }
    const Range values = spanOf(all, false);
    auto sx = [&](double step) { return x0 + (step - steps_.lo) / (steps_.hi - steps_.lo) * (x1 - x0); };
    auto sy = [&](double v) { return y1 - (v - values.lo) / (values.hi - values.lo) * (y1 - y0); };

    for (double t : niceTicks(steps_.lo, steps_.hi, 8)) {
      const double x = sx(t);
      out_ += fmt::format("<line class=\"x-tick\" x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#eeeeee\"/>"
                          "<line x1=\"{0}\" y1=\"{2}\" x2=\"{0}\" y2=\"{3}\" stroke=\"#888888\"/>"
                          "<text x=\"{0}\" y=\"{4}\" text-anchor=\"middle\" font-size=\"11\">{5}</text>\n",
                          svgNumber(x), svgNumber(y0), svgNumber(y1), svgNumber(y1 + 5), svgNumber(y1 + 17), tickLabel(t));
    }
    for (double t : niceTicks(values.lo, values.hi, 6)) {
      const double y = sy(t);
      out_ += fmt::format("<line class=\"y-tick\" x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#eeeeee\"/>"
                          "<line x1=\"{3}\" y1=\"{1}\" x2=\"{0}\" y2=\"{1}\" stroke=\"#888888\"/>"
                          "<text x=\"{4}\" y=\"{5}\" text-anchor=\"end\" font-size=\"11\">{6}</text>\n",
                          svgNumber(x0), svgNumber(y), svgNumber(x1), svgNumber(x0 - 5), svgNumber(x0 - 8), svgNumber(y + 4), tickLabel(t));
    }
    out_ += fmt::format("<text class=\"x-label\" x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"12\">step</text>\n",
                        svgNumber((x0 + x1) / 2), svgNumber(y1 + 34));
    const double ly = (y0 + y1) / 2;
    out_ += fmt::format("<text class=\"y-label\" x=\"{0}\" y=\"{1}\" text-anchor=\"middle\" font-size=\"12\" "
                        "transform=\"rotate(-90 {0} {1})\">{2}</text>\n",
                        svgNumber(16), svgNumber(ly), svgEscape(p.y_label));

    double legend_x = x1;
    for (auto it = p.series.rbegin(); it != p.series.rend(); ++it) {  // right-aligned, in order
      const Series& s = *it;
      legend_x -= 14.0 + 7.0 * static_cast<double>(std::strlen(s.name)) + 24.0;
      out_ += fmt::format("<g class=\"legend\"><line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" "
                          "stroke-width=\"2.5\"/><text x=\"{4}\" y=\"{5}\" font-size=\"12\">{6}</text></g>\n",
                          svgNumber(legend_x), svgNumber(top + 14), svgNumber(legend_x + 18), s.colour, svgNumber(legend_x + 22),
                          svgNumber(top + 18), svgEscape(s.name));
    }

    for (const Series& s : p.series) {
      if (s.points->empty()) continue;
      std::string points;
      for (const MetricPoint& pt : *s.points) {
        points += fmt::format("{}{},{}", points.empty() ? "" : " ", svgNumber(sx(pt.step)), svgNumber(sy(pt.value)));
      }
      out_ += fmt::format("<polyline class=\"series\" data-series=\"{}\" fill=\"none\" stroke=\"{}\" "
                          "stroke-width=\"1.5\" points=\"{}\"/>\n",
                          svgEscape(s.name), s.colour, points);
      if (s.markers || s.points->size() < 2) {
        for (const MetricPoint& pt : *s.points) {
          out_ += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"3\" fill=\"{}\"/>\n", svgNumber(sx(pt.step)),
                              svgNumber(sy(pt.value)), s.colour);
        }
      }
    }
    out_ += "</g>\n";
  }

  std::string& text() { return out_; }

 private:
  const PlotOptions& options_;
  Range steps_;
  std::string out_;
};

}  // namespace

std::string metricsSvg(const MetricsSeries& m, const PlotOptions& options) {
  const std::string unit = m.throughput_unit.empty() ? "tokens/s" : m.throughput_unit;
  const std::vector<Panel> panels = {
      {"Loss", "loss",
       {{"train loss", "#1f77b4", &m.train_loss, false}, {"held-out loss", "#d62728", &m.eval_loss, true}},
       "no \"train\" or \"eval\" event has a \"loss\""},
      {"Learning rate", "lr", {{"learning rate", "#2ca02c", &m.lr, false}}, "no \"train\" event has an \"lr\""},
      {fmt::format("Throughput ({})", unit), unit, {{"throughput", "#9467bd", &m.throughput, false}},
       "no \"train\" event has \"tokens_per_s\" or \"rows_per_s\""},
      {"Gradient norm", "grad norm", {{"grad norm", "#ff7f0e", &m.grad_norm, false}},
       "no \"train\" event has a \"grad_norm\" (this run did not log it)"},
  };
  // One step axis for every panel, so the panels line up.
  const Range steps = spanOf({&m.train_loss, &m.eval_loss, &m.lr, &m.throughput, &m.grad_norm}, true);
  const double header = options.title.empty() ? 0.0 : 28.0;
  const double height = header + options.panel_height * static_cast<double>(panels.size());
  SvgBuilder svg(options, steps);
  std::string& out = svg.text();
  out += fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
                     "font-family=\"sans-serif\">\n",
                     svgNumber(options.panel_width), svgNumber(height));
  out += fmt::format("<rect width=\"{}\" height=\"{}\" fill=\"#fafafa\"/>\n", svgNumber(options.panel_width), svgNumber(height));
  if (!options.title.empty()) {
    out += fmt::format("<text class=\"title\" x=\"{}\" y=\"20\" text-anchor=\"middle\" font-size=\"16\">{}</text>\n",
                       svgNumber(options.panel_width / 2), svgEscape(options.title));
  }
  for (std::size_t i = 0; i < panels.size(); ++i) {
    svg.panel(panels[i], header + options.panel_height * static_cast<double>(i));
  }
  out += "</svg>\n";
  return out;
}

}  // namespace pipeforge::train
