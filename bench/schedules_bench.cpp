// pipeforge_bench_schedules: how fast the torch-free schedule library is at
// pipeline sizes people run, and how its schedules compare.
//
//   1. generate + validate + lower + simulate (unit-time and cost-aware) for
//      64 ranks x 4 stages per rank x 128 microbatches, each phase timed;
//   2. the bubble table: simulated bubble fraction of each named schedule
//      against its closed form, over (p, m) (F = I = W = 1, no latency);
//   3. auto vs the best named schedule that fits the same memory limit, for
//      equal and unequal costs, with the ratio measured in this run.
//
// `--quick` shrinks part 1 to 16 x 4 x 32 and part 3 to the small configs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "schedules/auto_schedule.h"
#include "schedules/cost_model.h"
#include "schedules/generate.h"
#include "schedules/lower.h"
#include "schedules/simulate_cost.h"
#include "schedules/simulate_unit.h"
#include "schedules/validate.h"

namespace {

using namespace pipeforge::schedules;
using Clock = std::chrono::steady_clock;

template <typename F>
double timeMs(F&& f) {
  const auto start = Clock::now();
  f();
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::size_t countActions(const Program& p) {
  std::size_t n = 0;
  for (const auto& row : p.actions) {
    for (const auto& cell : row) n += cell ? 1 : 0;
  }
  return n;
}

double peakOf(const CostSimulation& sim) {
  return *std::max_element(sim.peak_memory.begin(), sim.peak_memory.end());
}

void phases(int p, int v, int m) {
  fmt::print("== 1. Phase timings: {} ranks x {} stages per rank x {} microbatches ==\n", p, v, m);
  fmt::print("{:<22} {:>9} {:>9} {:>9} {:>10} {:>10} {:>10} {:>9} {:>9}\n", "schedule", "generate",
             "validate", "lower", "unit-sim", "cost-sim", "cost-sim", "compute", "lowered");
  fmt::print("{:<22} {:>9} {:>9} {:>9} {:>10} {:>10} {:>10} {:>9} {:>9}\n", "", "ms", "ms", "ms",
             "ms", "compute ms", "lowered ms", "actions", "actions");
  const CostModel costs = CostModel::uniform(1, 1.3, 0.7, 0.1);
  for (const char* name : {"Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
                           "MegatronInterleaved"}) {
    Program compute, lowered;
    UnitSimulation unit;
    CostSimulation timed_compute, timed_lowered;
    double t_gen = 0, t_val = 0, t_low = 0, t_unit = 0, t_cost = 0, t_cost_low = 0;
    try {
      t_gen = timeMs([&] { compute = generateSchedule(name, {p, v, m}); });
      t_val = timeMs([&] { validateProgram(compute); });
      t_low = timeMs([&] { lowered = lowerForExecution(compute); });
      t_unit = timeMs([&] { unit = simulateUnit(lowered); });
      t_cost = timeMs([&] { timed_compute = simulateCost(compute, costs); });
      t_cost_low = timeMs([&] { timed_lowered = simulateCost(lowered, costs); });
    } catch (const ScheduleError& e) {
      fmt::print("{:<22} skipped: {:.100}\n", name, e.what());
      continue;
    }
    fmt::print("{:<22} {:>9.1f} {:>9.1f} {:>9.1f} {:>10.1f} {:>10.1f} {:>10.1f} {:>9} {:>9}\n",
               name, t_gen, t_val, t_low, t_unit, t_cost, t_cost_low, countActions(compute),
               countActions(lowered));
    fmt::print("{:<22} unit steps {}, makespan compute-only {:.1f}, lowered {:.1f} "
               "(lowered/compute {:.3f})\n",
               "", unit.num_steps, timed_compute.makespan, timed_lowered.makespan,
               timed_lowered.makespan / timed_compute.makespan);
  }
  fmt::print("\n");
}

struct Formula {
  const char* name;
  int v;
  const char* text;
  std::function<double(int p, int m, int v)> bubble;
  std::function<bool(int p, int m)> applies;
};

void bubbleTable() {
  fmt::print("== 2. Bubble table: simulated vs theoretical (F = I = W = 1, B = 2, no latency) ==\n");
  const std::vector<Formula> formulas = {
      {"GPipe", 1, "(p-1)/(m+p-1)", [](int p, int m, int) { return double(p - 1) / (m + p - 1); },
       [](int, int) { return true; }},
      {"1F1B", 1, "(p-1)/(m+p-1)", [](int p, int m, int) { return double(p - 1) / (m + p - 1); },
       [](int p, int m) { return m >= p; }},
      {"Interleaved1F1B", 2, "(p-1)/(v*m+p-1)",
       [](int p, int m, int v) { return double(p - 1) / (v * m + p - 1); },
       [](int p, int m) { return m >= p; }},
      {"InterleavedZeroBubble", 1, "(p-1)/(3*v*m+p-1)",
       [](int p, int m, int v) { return double(p - 1) / (3 * v * m + p - 1); },
       [](int p, int m) { return m >= p; }},
      {"InterleavedZeroBubble", 2, "(p-1)/(3*v*m+p-1)",
       [](int p, int m, int v) { return double(p - 1) / (3 * v * m + p - 1); },
       [](int p, int m) { return m >= p; }},
      {"ZBVZeroBubble", 2, "(p-1)/(6*m+p-1)",
       [](int p, int m, int) { return double(p - 1) / (6 * m + p - 1); },
       [](int p, int m) { return m >= 2 * p; }},
  };
  fmt::print("{:<22} {:>2} {:>3} {:>3} {:>10} {:>10} {:>8}  {}\n", "schedule", "v", "p", "m",
             "simulated", "theory", "sim/th", "closed form");
  const CostModel equal = CostModel::uniform(1, 1, 1);
  for (const Formula& f : formulas) {
    for (int p : {4, 8}) {
      for (int m : {8, 16, 32, 64}) {
        if (!f.applies(p, m)) continue;
        Program program = generateSchedule(f.name, {p, f.v, m});
        const double simulated = simulateCost(program, equal).totalBubbleFraction();
        const double theory = f.bubble(p, m, f.v);
        fmt::print("{:<22} {:>2} {:>3} {:>3} {:>10.4f} {:>10.4f} {:>8.4f}  {}\n", f.name, f.v, p,
                   m, simulated, theory, simulated / theory, f.text);
      }
    }
  }
  // The zero-bubble claim as a ratio: ZB1P idles a third of what 1F1B idles.
  for (int p : {4, 8}) {
    const int m = 4 * p;
    const CostSimulation zb = simulateCost(generateSchedule("InterleavedZeroBubble", {p, 1, m}), equal);
    const CostSimulation ob = simulateCost(generateSchedule("1F1B", {p, 1, m}), equal);
    fmt::print("ZB1P / 1F1B idle time at p={}, m={}: {:.4f} (bubble fractions {:.4f} / {:.4f})\n", p,
               m, (zb.makespan - zb.busy_time[0]) / (ob.makespan - ob.busy_time[0]),
               zb.totalBubbleFraction(), ob.totalBubbleFraction());
  }
  fmt::print("\n");
}

void autoVsNamed(bool quick) {
  fmt::print("== 3. auto vs the best named schedule within the same memory limit ==\n");
  fmt::print("{:<28} {:<16} {:>6} {:<34} {:>9} {:>9} {:>8} {:>8}\n", "costs", "p x v x m layout",
             "limit", "best named", "named", "auto", "auto/nm", "auto ms");
  struct Config {
    int p, v, m;
    StageLayout layout;
    double limit;  // 0: none
  };
  std::vector<Config> configs = {
      {4, 1, 8, StageLayout::kLoop, 0},  {4, 2, 8, StageLayout::kLoop, 0},
      {4, 2, 8, StageLayout::kV, 0},     {4, 2, 8, StageLayout::kV, 8},
      {4, 2, 16, StageLayout::kLoop, 8}, {8, 1, 16, StageLayout::kLoop, 0},
      {8, 2, 16, StageLayout::kV, 0},    {8, 2, 16, StageLayout::kV, 16}};
  if (!quick) {
    configs.push_back({8, 2, 32, StageLayout::kLoop, 16});
    configs.push_back({16, 2, 32, StageLayout::kV, 0});
  }
  const std::vector<std::pair<const char*, CostModel>> cost_sets = {
      {"equal F=I=W=1", CostModel::uniform(1, 1, 1)},
      {"F=1 I=1.3 W=0.7 C=0.1", CostModel::uniform(1, 1.3, 0.7, 0.1)},
      {"F=1 I=2 W=0.5 C=0.3", CostModel::uniform(1, 2, 0.5, 0.3)}};
  double worst = 0.0, best = std::numeric_limits<double>::infinity();
  for (const auto& [label, costs] : cost_sets) {
    for (const Config& c : configs) {
      AutoScheduleConfig config;
      config.num_ranks = c.p;
      config.stages_per_rank = c.v;
      config.num_microbatches = c.m;
      config.layout = c.layout;
      config.costs = costs;
      if (c.limit > 0) config.memory_limit = c.limit;
      AutoScheduleResult result;
      const double ms = timeMs([&] { result = autoSchedule(config); });
      const std::string shape = fmt::format("{}x{}x{} {}", c.p, c.v, c.m,
                                            c.layout == StageLayout::kV ? "V" : "loop");
      const std::string limit = c.limit > 0 ? fmt::format("{:g}", c.limit) : "-";
      if (!result.best_named) {
        fmt::print("{:<28} {:<16} {:>6} {:<34} {:>9} {:>9.2f} {:>8} {:>8.0f}\n", label, shape,
                   limit, "(none fits)", "-", result.simulation.makespan, "-", ms);
        continue;
      }
      const double ratio = result.simulation.makespan / *result.best_named_makespan;
      worst = std::max(worst, ratio);
      best = std::min(best, ratio);
      fmt::print("{:<28} {:<16} {:>6} {:<34} {:>9.2f} {:>9.2f} {:>8.4f} {:>8.0f}\n", label, shape,
                 limit, *result.best_named, *result.best_named_makespan,
                 result.simulation.makespan, ratio, ms);
    }
  }
  fmt::print("auto/named over all rows: best {:.4f}, worst {:.4f} (never above 1 by construction)\n\n",
             best, worst);
}

void bigAuto(int p, int v, int m) {
  fmt::print("== auto at {} x {} x {} (F=1 I=1.3 W=0.7 C=0.1, no memory limit) ==\n", p, v, m);
  AutoScheduleConfig config;
  config.num_ranks = p;
  config.stages_per_rank = v;
  config.num_microbatches = m;
  config.costs = CostModel::uniform(1, 1.3, 0.7, 0.1);
  AutoScheduleResult result;
  const double ms = timeMs([&] { result = autoSchedule(config); });
  fmt::print("auto {:.1f} from {} in {:.0f} ms; best named {} {:.1f}; ratio {:.4f}; peak memory {:g}\n\n",
             result.simulation.makespan, result.origin, ms, result.best_named.value_or("-"),
             result.best_named_makespan.value_or(0.0),
             result.best_named_makespan ? result.simulation.makespan / *result.best_named_makespan
                                        : 0.0,
             peakOf(result.simulation));
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  try {
    if (quick) {
      phases(16, 4, 32);
    } else {
      phases(64, 4, 128);
    }
    bubbleTable();
    autoVsNamed(quick);
    if (!quick) bigAuto(64, 4, 128);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipeforge_bench_schedules: %s\n", e.what());
    return 1;
  }
  return 0;
}
