// A simulated schedule as an SVG picture: one lane per rank, time to the
// right, one box per compute action coloured by type (F, I, W, B,
// OVERLAP_F_B; later model chunks of a rank in a lighter shade) with its
// microbatch number inside, idle stretches hatched, a time axis and a legend.
// The output is a pure function of its input (byte-identical across runs).
#pragma once

#include <string>

#include "schedules/simulate_cost.h"

namespace pipeforge::schedules {

struct SvgTimelineOptions {
  // Horizontal scale; 0 fits the makespan into about 1200 pixels (at least 4
  // and at most 60 pixels per unit).
  double pixels_per_unit = 0.0;
  double lane_height = 26.0;
  std::string title;  // drawn above the lanes when not empty
};

// Geometry the picture uses, exposed so callers and tests can locate boxes.
struct SvgTimelineLayout {
  double left = 80.0;        // x of time 0
  double top = 0.0;          // y of the first lane
  double lane_height = 26.0;
  double lane_gap = 6.0;
  double pixels_per_unit = 1.0;

  double x(double time) const { return left + time * pixels_per_unit; }
  double y(int rank) const { return top + rank * (lane_height + lane_gap); }
};

SvgTimelineLayout svgTimelineLayout(const CostSimulation& simulation,
                                    const SvgTimelineOptions& options = {});

// `stage_to_rank` (may be empty) shades each rank's later stages lighter.
std::string svgTimeline(const CostSimulation& simulation, int num_ranks,
                        const std::vector<int>& stage_to_rank = {},
                        const SvgTimelineOptions& options = {});

}  // namespace pipeforge::schedules
