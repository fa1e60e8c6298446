#include "schedules/svg_timeline.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include <fmt/format.h>

#include "common/svg_text.h"

namespace pipeforge::schedules {

namespace {

constexpr double kEps = 1e-9;

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
    if (m * base >= raw - kEps) return m * base;
  }
  return 10.0 * base;
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
  if (num_ranks < 1) {
    throw ScheduleError(fmt::format("svg timeline: {} ranks; need at least 1", num_ranks));
  }
  if (!(options.lane_height > 4.0) || options.pixels_per_unit < 0.0 ||
      !std::isfinite(options.pixels_per_unit)) {
    throw ScheduleError(
        "svg timeline: lane_height must be above 4 and pixels_per_unit 0 (fit) or positive");
  }
  const SvgTimelineLayout L = svgTimelineLayout(simulation, options);
  // Local chunk index of each stage (0 for the rank's first stage, 1 for its next, ...).
  std::vector<int> chunk(stage_to_rank.size(), 0);
  int max_chunk = 0;
  {
    std::vector<int> seen(num_ranks, 0);
    for (std::size_t s = 0; s < stage_to_rank.size(); ++s) {
      const int r = stage_to_rank[s];
      if (r >= 0 && r < num_ranks) {
        chunk[s] = seen[r]++;
        max_chunk = std::max(max_chunk, chunk[s]);
      }
    }
  }
  auto shade = [&](const Action& a) {
    const int s = a.type == ActionType::kOverlapFB ? -1 : a.stage;
    if (s < 0 || static_cast<std::size_t>(s) >= chunk.size() || max_chunk == 0) return 0.0;
    return 0.5 * chunk[s] / max_chunk;
  };

  std::vector<std::vector<const TimedAction*>> lanes(num_ranks);
  for (const TimedAction& e : simulation.events) {
    if (e.rank < 0 || e.rank >= num_ranks) {
      throw ScheduleError(fmt::format(
          "svg timeline: an event runs on rank {}, but the picture has ranks 0..{}", e.rank,
          num_ranks - 1));
    }
    if (e.end > e.start + kEps) lanes[e.rank].push_back(&e);
  }
  for (auto& lane : lanes) {
    std::stable_sort(lane.begin(), lane.end(), [](const TimedAction* a, const TimedAction* b) {
      return std::tie(a->start, a->step) < std::tie(b->start, b->step);
    });
  }

  const double span = simulation.makespan;
  const double lanes_bottom = L.y(num_ranks) - L.lane_gap;
  const double axis_y = lanes_bottom + 6.0;
  const double legend_y = axis_y + 30.0;
  // Wide enough for the lanes and for the legend line.
  const double width = std::max(L.x(span) + 24.0, L.left + 900.0);
  const double height = legend_y + 26.0;
  const double font = std::min(12.0, L.lane_height * 0.5);

  std::string out;
  out += fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n",
      svgNumber(width), svgNumber(height), svgNumber(width), svgNumber(height));
  out +=
      "<defs><pattern id=\"idle\" patternUnits=\"userSpaceOnUse\" width=\"6\" height=\"6\" "
      "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#f3f3f3\"/>"
      "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#c4c4c4\" stroke-width=\"2\"/>"
      "</pattern></defs>\n";
  out += fmt::format("<rect class=\"background\" x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" "
                     "fill=\"#ffffff\"/>\n",
                     svgNumber(width), svgNumber(height));
  if (!options.title.empty()) {
    out += fmt::format("<text class=\"title\" x=\"{}\" y=\"22\" font-size=\"14\">{}</text>\n",
                       svgNumber(L.left), svgEscape(options.title));
  }
  for (int r = 0; r < num_ranks; ++r) {
    const double y = L.y(r);
    out += fmt::format(
        "<text class=\"rank-label\" x=\"{}\" y=\"{}\" text-anchor=\"end\" "
        "dominant-baseline=\"middle\">rank {}</text>\n",
        svgNumber(L.left - 8.0), svgNumber(y + L.lane_height / 2), r);
    // Idle stretches, hatched, so bubbles show as bubbles.
    double cursor = 0.0;
    auto idle = [&](double from, double to) {
      if (to - from <= kEps) return;
      out += fmt::format(
          "<rect class=\"idle\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" "
          "fill=\"url(#idle)\"><title>rank {} idle {}-{}</title></rect>\n",
          svgNumber(L.x(from)), svgNumber(y), svgNumber((to - from) * L.pixels_per_unit), svgNumber(L.lane_height), r,
          svgNumber(from), svgNumber(to));
    };
    for (const TimedAction* e : lanes[r]) {
      idle(cursor, e->start);
      cursor = std::max(cursor, e->end);
    }
    idle(cursor, span);
    for (const TimedAction* e : lanes[r]) {
      const Style st = styleOf(e->action.type);
      const double x = L.x(e->start);
      const double w = (e->end - e->start) * L.pixels_per_unit;
      const std::string name = formatAction(e->action);
      out += fmt::format(
          "<rect class=\"op op-{}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" "
          "stroke=\"#ffffff\" stroke-width=\"0.5\"><title>rank {}: {} {}-{}</title></rect>\n",
          st.label, svgNumber(x), svgNumber(y), svgNumber(w), svgNumber(L.lane_height), colour(st, shade(e->action)),
          e->rank, svgEscape(name), svgNumber(e->start), svgNumber(e->end));
      std::string label;
      if (e->action.type == ActionType::kOverlapFB) {
        for (const Action& sub : e->action.sub_actions) {
          if (!label.empty()) label += "/";
          label += sub.microbatch ? std::to_string(*sub.microbatch) : "";
        }
      } else if (e->action.microbatch) {
        label = std::to_string(*e->action.microbatch);
      }
      out += fmt::format(
          "<text class=\"mb\" x=\"{}\" y=\"{}\" text-anchor=\"middle\" "
          "dominant-baseline=\"middle\" font-size=\"{}\" fill=\"#1a1a1a\">{}</text>\n",
          svgNumber(x + w / 2), svgNumber(y + L.lane_height / 2), svgNumber(font), svgEscape(label));
    }
  }
  // Time axis.
  out += fmt::format("<line class=\"axis\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" "
                     "stroke=\"#555555\"/>\n",
                     svgNumber(L.x(0)), svgNumber(axis_y), svgNumber(L.x(span)), svgNumber(axis_y));
  const double step = niceStep(span);
  for (int k = 0; k * step <= span + kEps; ++k) {
    const double t = k * step;
    out += fmt::format(
        "<line class=\"tick\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#555555\"/>"
        "<text class=\"tick-label\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{:g}</text>\n",
        svgNumber(L.x(t)), svgNumber(axis_y), svgNumber(L.x(t)), svgNumber(axis_y + 4), svgNumber(L.x(t)), svgNumber(axis_y + 16),
        std::round(t * 1e6) / 1e6);
  }
  // Legend.
  double lx = L.left;
  auto legend = [&](const std::string& fill, const std::string& text) {
    out += fmt::format(
        "<rect class=\"legend\" x=\"{}\" y=\"{}\" width=\"14\" height=\"14\" fill=\"{}\" "
        "stroke=\"#888888\" stroke-width=\"0.5\"/><text class=\"legend-label\" x=\"{}\" "
        "y=\"{}\" dominant-baseline=\"middle\">{}</text>\n",
        svgNumber(lx), svgNumber(legend_y), fill, svgNumber(lx + 18), svgNumber(legend_y + 7), svgEscape(text));
    lx += 26.0 + 7.0 * static_cast<double>(text.size());
  };
  legend(colour(styleOf(ActionType::kForward), 0.0), "F forward");
  legend(colour(styleOf(ActionType::kBackwardInput), 0.0), "I backward (input)");
  legend(colour(styleOf(ActionType::kBackwardWeight), 0.0), "W backward (weight)");
  legend(colour(styleOf(ActionType::kFullBackward), 0.0), "B backward (full)");
  legend(colour(styleOf(ActionType::kOverlapFB), 0.0), "OVERLAP_F_B");
  legend("url(#idle)", "idle");
  if (max_chunk > 0) {
    out += fmt::format(
        "<text class=\"legend-note\" x=\"{}\" y=\"{}\" dominant-baseline=\"middle\">"
        "lighter = later stage on the rank; numbers = microbatch</text>\n",
        svgNumber(lx), svgNumber(legend_y + 7));
  } else {
    out += fmt::format(
        "<text class=\"legend-note\" x=\"{}\" y=\"{}\" dominant-baseline=\"middle\">"
        "numbers = microbatch</text>\n",
        svgNumber(lx), svgNumber(legend_y + 7));
  }
  out += "</svg>\n";
  return out;
}

}  // namespace pipeforge::schedules
