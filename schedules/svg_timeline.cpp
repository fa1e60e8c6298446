#include "schedules/svg_timeline.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include <fmt/format.h>

#include "common/svg_text.h"

namespace pipeforge::schedules {

namespace {

constexpr double kPixelEps = 1e-9;  // below this, two coordinates are one

struct Style {
  const char* label;
  int r, g, b;
};

// Colour-blind-friendly hues (Tableau 10), readable under black text.
Style styleOf(ActionType type) {
  switch (type) {
    case ActionType::kForward:
      return {"F", 0x76, 0xa5, 0xd8};
    case ActionType::kBackwardInput:
      return {"I", 0xf2, 0xa6, 0x5a};
    case ActionType::kBackwardWeight:
      return {"W", 0x7f, 0xc0, 0x72};
    case ActionType::kFullBackward:
      return {"B", 0xe8, 0x7a, 0x7c};
    case ActionType::kUnshard:
    case ActionType::kReshard:
    case ActionType::kSendF:
    case ActionType::kRecvF:
    case ActionType::kSendB:
    case ActionType::kRecvB:
    case ActionType::kReduceGrad:
    case ActionType::kOverlapFB:
      return {"OVERLAP_F_B", 0xb9, 0x93, 0xc4};
  }
  unknownActionType(type);
}

// `lighten` in [0, 1): share of white mixed in.
std::string colour(const Style& s, double lighten) {
  auto mix = [&](int c) { return static_cast<int>(std::lround(c + (255 - c) * lighten)); };
  return fmt::format("#{:02x}{:02x}{:02x}", mix(s.r), mix(s.g), mix(s.b));
}

double niceStep(double span) {
  if (span <= 0.0) return 1.0;
  const double raw = span / 10.0;
  const double base = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * base >= raw - kPixelEps) return m * base;
  }
  return 10.0 * base;
}

void checkTimelineInput(int num_ranks, const SvgTimelineOptions& options) {
  if (num_ranks < 1) {
    throw ScheduleError(fmt::format("svg timeline: {} ranks; need at least 1", num_ranks));
  }
  if (!(options.lane_height > 4.0) || options.pixels_per_unit < 0.0 ||
      !std::isfinite(options.pixels_per_unit)) {
    throw ScheduleError(
        "svg timeline: lane_height must be above 4 and pixels_per_unit 0 (fit) or positive");
  }
}

// Later stages of a rank in lighter shades: each stage's local chunk index
// (0 for the rank's first stage, 1 for its next, ...).
class StageShading {
 public:
  StageShading(const std::vector<int>& stage_to_rank, int num_ranks) : chunk_(stage_to_rank.size(), 0) {
    std::vector<int> seen(num_ranks, 0);
    for (std::size_t s = 0; s < stage_to_rank.size(); ++s) {
      const int r = stage_to_rank[s];
      if (r >= 0 && r < num_ranks) {
        chunk_[s] = seen[r]++;
        max_chunk_ = std::max(max_chunk_, chunk_[s]);
      }
    }
  }

  bool shadesAnything() const { return max_chunk_ > 0; }

  // The share of white mixed into the action's colour (see colour()).
  double lighten(const Action& a) const {
    const int s = a.type == ActionType::kOverlapFB ? -1 : a.stage;
    if (s < 0 || static_cast<std::size_t>(s) >= chunk_.size() || max_chunk_ == 0) return 0.0;
    return 0.5 * chunk_[s] / max_chunk_;
  }

 private:
  std::vector<int> chunk_;
  int max_chunk_ = 0;
};

// Per rank, its events that take time, by start (then step).
std::vector<std::vector<const TimedAction*>> lanesOf(const CostSimulation& simulation, int num_ranks) {
  std::vector<std::vector<const TimedAction*>> lanes(num_ranks);
  for (const TimedAction& e : simulation.events) {
    if (e.rank < 0 || e.rank >= num_ranks) {
      throw ScheduleError(fmt::format(
          "svg timeline: an event runs on rank {}, but the picture has ranks 0..{}", e.rank,
          num_ranks - 1));
    }
    if (e.end > e.start + kPixelEps) lanes[e.rank].push_back(&e);
  }
  for (auto& lane : lanes) {
    std::stable_sort(lane.begin(), lane.end(), [](const TimedAction* a, const TimedAction* b) {
      return std::tie(a->start, a->step) < std::tie(b->start, b->step);
    });
  }
  return lanes;
}

// The text inside a box: the microbatch, or an OVERLAP_F_B's sub-action microbatches "3/1".
std::string microbatchLabel(const Action& a) {
  std::string label;
  if (a.type == ActionType::kOverlapFB) {
    for (const Action& sub : a.sub_actions) {
      if (!label.empty()) label += "/";
      label += sub.microbatch ? std::to_string(*sub.microbatch) : "";
    }
  } else if (a.microbatch) {
    label = std::to_string(*a.microbatch);
  }
  return label;
}

// Writes the picture top to bottom: header, one lane per rank, time axis, legend.
class TimelineDrawing {
 public:
  TimelineDrawing(const CostSimulation& simulation, int num_ranks, const SvgTimelineOptions& options)
      : L_(svgTimelineLayout(simulation, options)),
        span_(simulation.makespan),
        axis_y_(L_.y(num_ranks) - L_.lane_gap + 6.0),
        legend_y_(axis_y_ + 30.0),
        // Wide enough for the lanes and for the legend line.
        width_(std::max(L_.x(span_) + 24.0, L_.left + 900.0)),
        height_(legend_y_ + 26.0),
        font_(std::min(12.0, L_.lane_height * 0.5)) {}

  void drawHeader(const std::string& title);
  void drawLane(int r, const std::vector<const TimedAction*>& lane, const StageShading& shading);
  void drawAxis();
  void drawLegend(const StageShading& shading);
  std::string finish() { return std::move(out_) + "</svg>\n"; }

 private:
  void drawIdle(int r, double from, double to);
  void drawAction(const TimedAction& e, double lighten);
  void drawLegendEntry(const std::string& fill, const std::string& text);

  const SvgTimelineLayout L_;
  const double span_;
  const double axis_y_;
  const double legend_y_;
  const double width_;
  const double height_;
  const double font_;
  double legend_x_ = L_.left;
  std::string out_;
};

void TimelineDrawing::drawHeader(const std::string& title) {
  out_ += fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n",
      svgNumber(width_), svgNumber(height_), svgNumber(width_), svgNumber(height_));
  out_ +=
      "<defs><pattern id=\"idle\" patternUnits=\"userSpaceOnUse\" width=\"6\" height=\"6\" "
      "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#f3f3f3\"/>"
      "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#c4c4c4\" stroke-width=\"2\"/>"
      "</pattern></defs>\n";
  out_ += fmt::format("<rect class=\"background\" x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" "
                      "fill=\"#ffffff\"/>\n",
                      svgNumber(width_), svgNumber(height_));
  if (!title.empty()) {
    out_ += fmt::format("<text class=\"title\" x=\"{}\" y=\"22\" font-size=\"14\">{}</text>\n",
                        svgNumber(L_.left), svgEscape(title));
  }
}

// The rank's label, its idle stretches hatched (so bubbles show as bubbles),
// then its actions.
void TimelineDrawing::drawLane(int r, const std::vector<const TimedAction*>& lane,
                               const StageShading& shading) {
  out_ += fmt::format(
      "<text class=\"rank-label\" x=\"{}\" y=\"{}\" text-anchor=\"end\" "
      "dominant-baseline=\"middle\">rank {}</text>\n",
      svgNumber(L_.left - 8.0), svgNumber(L_.y(r) + L_.lane_height / 2), r);
  double cursor = 0.0;
  for (const TimedAction* e : lane) {
    drawIdle(r, cursor, e->start);
    cursor = std::max(cursor, e->end);
  }
  drawIdle(r, cursor, span_);
  for (const TimedAction* e : lane) drawAction(*e, shading.lighten(e->action));
}

void TimelineDrawing::drawIdle(int r, double from, double to) {
  if (to - from <= kPixelEps) return;
  out_ += fmt::format(
      "<rect class=\"idle\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" "
      "fill=\"url(#idle)\"><title>rank {} idle {}-{}</title></rect>\n",
      svgNumber(L_.x(from)), svgNumber(L_.y(r)), svgNumber((to - from) * L_.pixels_per_unit),
      svgNumber(L_.lane_height), r, svgNumber(from), svgNumber(to));
}

void TimelineDrawing::drawAction(const TimedAction& e, double lighten) {
  const Style st = styleOf(e.action.type);
  const double x = L_.x(e.start);
  const double y = L_.y(e.rank);
  const double w = (e.end - e.start) * L_.pixels_per_unit;
  out_ += fmt::format(
      "<rect class=\"op op-{}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" "
      "stroke=\"#ffffff\" stroke-width=\"0.5\"><title>rank {}: {} {}-{}</title></rect>\n",
      st.label, svgNumber(x), svgNumber(y), svgNumber(w), svgNumber(L_.lane_height),
      colour(st, lighten), e.rank, svgEscape(formatAction(e.action)), svgNumber(e.start),
      svgNumber(e.end));
  out_ += fmt::format(
      "<text class=\"mb\" x=\"{}\" y=\"{}\" text-anchor=\"middle\" "
      "dominant-baseline=\"middle\" font-size=\"{}\" fill=\"#1a1a1a\">{}</text>\n",
      svgNumber(x + w / 2), svgNumber(y + L_.lane_height / 2), svgNumber(font_),
      svgEscape(microbatchLabel(e.action)));
}

void TimelineDrawing::drawAxis() {
  out_ += fmt::format("<line class=\"axis\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" "
                      "stroke=\"#555555\"/>\n",
                      svgNumber(L_.x(0)), svgNumber(axis_y_), svgNumber(L_.x(span_)),
                      svgNumber(axis_y_));
  const double step = niceStep(span_);
  for (int k = 0; k * step <= span_ + kPixelEps; ++k) {
    const double t = k * step;
    out_ += fmt::format(
        "<line class=\"tick\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#555555\"/>"
        "<text class=\"tick-label\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{:g}</text>\n",
        svgNumber(L_.x(t)), svgNumber(axis_y_), svgNumber(L_.x(t)), svgNumber(axis_y_ + 4),
        svgNumber(L_.x(t)), svgNumber(axis_y_ + 16), std::round(t * 1e6) / 1e6);
  }
}

void TimelineDrawing::drawLegend(const StageShading& shading) {
  drawLegendEntry(colour(styleOf(ActionType::kForward), 0.0), "F forward");
  drawLegendEntry(colour(styleOf(ActionType::kBackwardInput), 0.0), "I backward (input)");
  drawLegendEntry(colour(styleOf(ActionType::kBackwardWeight), 0.0), "W backward (weight)");
  drawLegendEntry(colour(styleOf(ActionType::kFullBackward), 0.0), "B backward (full)");
  drawLegendEntry(colour(styleOf(ActionType::kOverlapFB), 0.0), "OVERLAP_F_B");
  drawLegendEntry("url(#idle)", "idle");
  out_ += fmt::format(
      "<text class=\"legend-note\" x=\"{}\" y=\"{}\" dominant-baseline=\"middle\">{}</text>\n",
      svgNumber(legend_x_), svgNumber(legend_y_ + 7),
      shading.shadesAnything() ? "lighter = later stage on the rank; numbers = microbatch"
                               : "numbers = microbatch");
}

void TimelineDrawing::drawLegendEntry(const std::string& fill, const std::string& text) {
  out_ += fmt::format(
      "<rect class=\"legend\" x=\"{}\" y=\"{}\" width=\"14\" height=\"14\" fill=\"{}\" "
      "stroke=\"#888888\" stroke-width=\"0.5\"/><text class=\"legend-label\" x=\"{}\" "
      "y=\"{}\" dominant-baseline=\"middle\">{}</text>\n",
      svgNumber(legend_x_), svgNumber(legend_y_), fill, svgNumber(legend_x_ + 18),
      svgNumber(legend_y_ + 7), svgEscape(text));
  legend_x_ += 26.0 + 7.0 * static_cast<double>(text.size());
}

}  // namespace

SvgTimelineLayout svgTimelineLayout(const CostSimulation& simulation,
                                    const SvgTimelineOptions& options) {
  SvgTimelineLayout layout;
  layout.lane_height = options.lane_height;
  layout.top = options.title.empty() ? 12.0 : 36.0;
  if (options.pixels_per_unit > 0.0) {
    layout.pixels_per_unit = options.pixels_per_unit;
  } else if (simulation.makespan > 0.0) {
    layout.pixels_per_unit = std::clamp(1200.0 / simulation.makespan, 4.0, 60.0);
  } else {
    layout.pixels_per_unit = 60.0;
  }
  return layout;
}

std::string svgTimeline(const CostSimulation& simulation, int num_ranks,
                        const std::vector<int>& stage_to_rank,
                        const SvgTimelineOptions& options) {
  checkTimelineInput(num_ranks, options);
  const StageShading shading(stage_to_rank, num_ranks);
  const std::vector<std::vector<const TimedAction*>> lanes = lanesOf(simulation, num_ranks);
  TimelineDrawing drawing(simulation, num_ranks, options);
  drawing.drawHeader(options.title);
  for (int r = 0; r < num_ranks; ++r) drawing.drawLane(r, lanes[r], shading);
  drawing.drawAxis();
  drawing.drawLegend(shading);
  return drawing.finish();
}

}  // namespace pipeforge::schedules
