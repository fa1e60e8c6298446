// `pipeforge schedule`: generate (or load), lower, simulate and draw pipeline schedules.
//
//   pipeforge schedule --name NAME --ranks P --stages S --microbatches M
//       [--costs F,I,W[,C] | --cost-file COSTS.json] [--mem-limit X] [--layout loop|v]
//       [--lower] [--simulate] [--csv OUT.csv] [--trace OUT.json] [--svg OUT.svg]
//   pipeforge schedule --load IN.csv --format compute_only|compute_comms ...
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "cli/commands.h"
#include "common/atomic_file.h"
#include "common/english.h"
#include "common/error.h"
#include "cli/run_guarded.h"
#include "cli/schedule_memory.h"
#include "cli/usage_error.h"
#include "schedules/auto_schedule.h"
#include "schedules/chrome_trace.h"
#include "schedules/cost_model.h"
#include "schedules/csv.h"
#include "schedules/format_grid.h"
#include "schedules/generate.h"
#include "schedules/grid_legend.h"
#include "schedules/lower.h"
#include "schedules/program.h"
#include "schedules/simulate_cost.h"
#include "schedules/simulate_unit.h"
#include "schedules/svg_timeline.h"
#include "schedules/validate.h"

namespace pipeforge::cli {

namespace {

namespace sch = pipeforge::schedules;

struct ScheduleOptions {
  std::string name;
  int ranks = 0;
  int stages = 0;
  int microbatches = 0;
  int microbatch_group_size = 0;  // MegatronInterleaved only; 0: Megatron's default (--ranks)
  std::string load;
  std::string format = "compute_only";
  std::string costs;
  std::string cost_file;
  std::string mem_limit;  // a number in act_mem's unit, or bytes ("8GiB")
  std::string act_mem;    // a number (1: one microbatch's activations on one stage), or bytes ("512MiB")
  std::optional<double> w_share;
  std::string layout = "loop";
  double time_unit_us = 1000.0;
  bool lower = false;
  bool simulate = false;
  std::string csv;
  std::string trace;
  std::string svg;
};

std::string lowercase(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

// Note [Atomic writes]; the error says which output failed.
void writeOutput(const std::string& path, const std::string& text, const char* what) {
  try {
    writeFileAtomically(path, text);
  } catch (Error& e) {
    throw e.addContext(fmt::format("cannot write the {}", what));
  }
}

std::optional<sch::CostModel> readCosts(const ScheduleOptions& o, const MemoryOptions& memory, int num_stages) {
  std::optional<sch::CostModel> costs;
  if (!o.costs.empty()) {
    try {
      costs = sch::parseCostList(o.costs);
    } catch (const sch::ScheduleError& e) {
      throw UsageError(fmt::format("--costs: {}", e.what()));
    }
  }
  if (!o.cost_file.empty()) {
    std::ifstream in(o.cost_file);
    if (!in) throw UsageError(fmt::format("cannot open --cost-file '{}'", o.cost_file));
    nlohmann::json json;
    try {
      in >> json;
    } catch (const nlohmann::json::exception& e) {
      throw sch::ScheduleError(
          fmt::format("--cost-file '{}' is not valid JSON: {}", o.cost_file, e.what()));
    }
    try {
      costs = sch::costModelFromJson(json);
    } catch (const sch::ScheduleError& e) {
      throw sch::ScheduleError(fmt::format("--cost-file '{}': {}", o.cost_file, e.what()));
    }
  }
  if (!costs && (memory.act_mem || o.w_share || memory.mem_limit)) {
    // Memory questions need activation sizes; the default costs are unit ones.
    costs = sch::CostModel::uniform(1.0, 1.0, 1.0, 0.0);
  }
  if (costs) {
    if (memory.act_mem) {
      for (auto& stage : costs->stages) stage.activation_memory = *memory.act_mem;
    }
    if (o.w_share) costs->weight_memory_share = *o.w_share;
    costs->check(num_stages);
  }
  return costs;
}

// All values for a few ranks; min and max (with their ranks) for many.
template <typename Format>
std::string joinNumbers(const std::vector<double>& values, Format format) {
  if (values.size() > 16) {
    const auto lo = std::min_element(values.begin(), values.end());
    const auto hi = std::max_element(values.begin(), values.end());
    return fmt::format("min {} (rank {}), max {} (rank {})", format(*lo), lo - values.begin(), format(*hi),
                       hi - values.begin());
  }
  std::string out;
  for (std::size_t r = 0; r < values.size(); ++r) {
    if (r) out += ", ";
    out += format(values[r]);
  }
  return out;
}

void checkOptions(const ScheduleOptions& o) {
  const bool from_name = !o.name.empty();
  const bool from_file = !o.load.empty();
  if (from_name == from_file) {
    throw UsageError("give either --name NAME (with --ranks, --stages, --microbatches) or "
                     "--load IN.csv");
  }
  if (o.format != "compute_only" && o.format != "compute_comms") {
    throw UsageError(fmt::format(
        "--format {}: expected compute_only (F/I/W/B only) or compute_comms (with SEND/RECV)",
        o.format));
  }
  if (o.layout != "loop" && o.layout != "v") {
    throw UsageError(fmt::format("--layout {}: expected loop or v", o.layout));
  }
  if (!(o.time_unit_us > 0.0)) {
    throw UsageError(fmt::format("--time-unit-us {}: expected a positive number", o.time_unit_us));
  }
  if (!o.costs.empty() && !o.cost_file.empty()) {
    throw UsageError("give --costs or --cost-file, not both");
  }
}

// Where the program comes from, and what the later steps need with it.
struct ScheduleSource {
  sch::Program program;
  std::string title;
  std::optional<sch::CostModel> costs;
  bool is_auto = false;  // auto keeps --mem-limit itself; no check afterwards
};

void checkSizes(const ScheduleOptions& o) {
  if (o.ranks < 1 || o.stages < 1 || o.microbatches < 1) {
    throw UsageError(fmt::format(
        "--name needs --ranks, --stages and --microbatches, each at least 1 (got {}, {}, {})",
        o.ranks, o.stages, o.microbatches));
  }
  if (o.stages % o.ranks != 0) {
    const int below = std::max(o.ranks, o.stages / o.ranks * o.ranks);
    throw UsageError(fmt::format(
        "--stages {} is not a multiple of --ranks {}: every rank holds --stages / --ranks "
        "stages; use --stages {} or {}",
        o.stages, o.ranks, below, below + o.ranks));
  }
}

// Runs the `auto` search and prints what it found next to the best named schedule.
void searchAutoSchedule(const ScheduleOptions& o, const MemoryOptions& memory, ScheduleSource& source) {
  const int per_rank = o.stages / o.ranks;
  sch::AutoScheduleConfig config;
  config.num_ranks = o.ranks;
  config.stages_per_rank = per_rank;
  config.num_microbatches = o.microbatches;
  config.layout = o.layout == "v" ? sch::StageLayout::kV : sch::StageLayout::kLoop;
  config.costs = source.costs.value_or(sch::CostModel::uniform(1.0, 1.0, 1.0, 0.0));
  config.memory_limit = memory.mem_limit;
  const sch::AutoScheduleResult result = sch::autoSchedule(config);
  source.program = result.program;
  std::cout << fmt::format("auto: {} ({} layout), simulated makespan {:.4g} with {}\n",
                           result.origin, o.layout, result.simulation.makespan,
                           sch::describeCostModel(config.costs));
  // Without --mem-limit every named schedule of this layout competes.
  const std::string within =
      memory.mem_limit ? fmt::format(" within --mem-limit {}", memory.unit.format(*memory.mem_limit)) : "";
  if (result.best_named) {
    std::cout << fmt::format("      best named schedule{}: {} at {:.4g} ({:+.2f}%)\n", within,
                             *result.best_named, *result.best_named_makespan,
                             100.0 * (result.simulation.makespan / *result.best_named_makespan - 1.0));
  } else {
    std::cout << fmt::format("      no named schedule has this layout{}\n",
                             memory.mem_limit ? " and fits --mem-limit" : "");
  }
  source.title = fmt::format("auto ({}), {} ranks, {} per rank, {} microbatches", result.origin,
                             o.ranks, counted(per_rank, "stage"), o.microbatches);
}

void generateNamedSchedule(const ScheduleOptions& o, ScheduleSource& source) {
  const int per_rank = o.stages / o.ranks;
  if (!sch::canonicalScheduleName(o.name)) {
    throw UsageError(fmt::format("unknown schedule '{}'; the names (any case) are {}, auto",
                                 o.name, fmt::join(sch::scheduleNames(), ", ")));
  }
  if (o.layout != "loop") {
    throw UsageError("--layout chooses the layout for --name auto; named schedules "
                     "have their own (ZBVZeroBubble and DualPipeV fold into a V)");
  }
  if (o.microbatch_group_size != 0 && *sch::canonicalScheduleName(o.name) != "MegatronInterleaved") {
    throw UsageError(fmt::format("--microbatch-group-size applies to MegatronInterleaved only, not {}; remove it",
                                 *sch::canonicalScheduleName(o.name)));
  }
  sch::ScheduleConfig config;
  config.num_ranks = o.ranks;
  config.stages_per_rank = per_rank;
  config.num_microbatches = o.microbatches;
  config.microbatch_group_size_per_vp_stage = o.microbatch_group_size;
  try {
    source.program = sch::generateSchedule(o.name, config);
  } catch (const sch::ScheduleError& e) {
    throw sch::ScheduleError(fmt::format("--name {} --ranks {} --stages {} ({} per rank) "
                                         "--microbatches {}: {}",
                                         o.name, o.ranks, o.stages, per_rank,
                                         o.microbatches, e.what()));
  }
  source.title = fmt::format("{}, {} ranks, {} per rank, {} microbatches", o.name, o.ranks,
                             counted(per_rank, "stage"), o.microbatches);
}

// --name: a named schedule, or the `auto` search.
ScheduleSource scheduleFromName(const ScheduleOptions& o, const MemoryOptions& memory) {
  checkSizes(o);
  ScheduleSource source;
  source.costs = readCosts(o, memory, o.stages);
  source.is_auto = lowercase(o.name) == sch::kAutoScheduleName;
  if (source.is_auto) {
    searchAutoSchedule(o, memory, source);
  } else {
    generateNamedSchedule(o, source);
  }
  return source;
}

// --load: a PyTorch-format CSV, in the flavour --format names.
ScheduleSource scheduleFromFile(const ScheduleOptions& o, const MemoryOptions& memory) {
  if (o.ranks || o.stages || o.microbatches) {
    throw UsageError("--load reads ranks, stages and microbatches from the CSV; drop "
                     "--ranks/--stages/--microbatches");
  }
  if (o.layout != "loop") throw UsageError("--layout only applies to --name auto");
  ScheduleSource source;
  source.program = sch::loadCsvFile(o.load);
  const bool lowered = !sch::isComputeOnly(source.program);
  if (o.format == "compute_only" && lowered) {
    throw sch::ScheduleError(fmt::format(
        "{} holds communication actions (SEND/RECV, UNSHARD, ...), so it is not "
        "compute_only; pass --format compute_comms",
        o.load));
  }
  if (o.format == "compute_comms" && o.lower) {
    throw UsageError("--lower turns a compute_only schedule into a compute_comms one; "
                     + o.load + " is loaded as compute_comms already");
  }
  source.costs = readCosts(o, memory, source.program.num_stages);
  source.title = fmt::format("{} ({} ranks, {} stages, {} microbatches)", o.load,
                             source.program.num_ranks, source.program.num_stages,
                             source.program.num_microbatches);
  return source;
}

std::size_t gridRows(const sch::Program& program) {
  std::size_t rows = 0;
  for (const auto& rank : program.actions) rows = std::max(rows, rank.size());
  return rows;
}

void printGrid(const sch::Program& program, const std::string& title) {
  std::cout << title << "\n"
            << "step grid (each rank's actions in list order; a blank cell: the rank idles that step):\n"
            << sch::formatGrid(program) << sch::formatGridLegend(program.actions);
}

// --simulate: the unit-time step count and, with costs, the timed results.
void printSimulation(const sch::Program& program, const std::optional<sch::CostModel>& costs,
                     const std::optional<sch::CostSimulation>& timed, const MemoryOptions& memory) {
  const sch::Program lowered = !sch::isComputeOnly(program) ? program : sch::lowerForExecution(program);
  const sch::UnitSimulation unit = sch::simulateUnit(lowered);
  // The grid lists actions; the simulation counts time steps of the lowered
  // program, where every SEND and RECV takes a step of its own and a rank
  // waits while its input is on the way, so it is longer than the grid.
  const bool compute_only = sch::isComputeOnly(program);
  std::cout << fmt::format(
      "unit-time simulation: {} steps, of the schedule{} (as PyTorch's _simulate_comms_compute):\n"
      "  in each step a rank runs one action, compute or SEND/RECV, or waits for an input;\n"
      "  the grid above has {} rows: {}\n",
      unit.num_steps, compute_only ? " lowered to SEND/RECV" : "", gridRows(program),
      compute_only ? "compute actions only, without SEND/RECV or waits" : "the same actions, without waits");
  if (!timed) {
    std::cout << "  (give --costs F,I,W[,C] for the makespan, bubbles and peak memory)\n";
    return;
  }
  std::cout << fmt::format("cost simulation ({}):\n", sch::describeCostModel(*costs));
  std::cout << fmt::format("  makespan        {:.6g} (in the unit of the costs)\n", timed->makespan);
  std::cout << fmt::format("  bubble          {:.4f} overall (idle share of ranks x makespan); per rank {}\n",
                           timed->totalBubbleFraction(),
                           joinNumbers(timed->bubble_fraction, [](double v) { return fmt::format("{:.4f}", v); }));
  std::cout << fmt::format("  peak memory     per rank {}{}\n",
                           joinNumbers(timed->peak_memory, [&](double v) { return memory.unit.format(v); }),
                           memory.unit.bytes ? "" : " " + memory.unit.name);
}

// A named or loaded schedule must keep --mem-limit (auto searched within it).
void checkPeakMemory(const sch::CostSimulation& timed, double mem_limit, const MemoryOptions& memory) {
  for (std::size_t r = 0; r < timed.peak_memory.size(); ++r) {
    if (timed.peak_memory[r] > mem_limit + 1e-9) {
      throw sch::ScheduleError(fmt::format(
          "the schedule peaks at {} of activation memory on rank {}, above --mem-limit {}; choose "
          "another schedule, more microbatch memory, or --name auto",
          memory.unit.format(timed.peak_memory[r]), r, memory.unit.format(mem_limit)));
    }
  }
}

// --trace and --svg: cost-aware times when costs are known, PyTorch's unit steps otherwise.
void writeTimelines(const ScheduleOptions& o, const ScheduleSource& source,
                    const std::optional<sch::CostSimulation>& timed) {
  const sch::Program& program = source.program;
  const sch::CostSimulation shown =
      timed ? *timed : sch::simulateCost(program, sch::CostModel::unitSteps());
  if (!o.trace.empty()) {
    sch::ChromeTraceOptions trace_options;
    trace_options.microseconds_per_unit = o.time_unit_us;
    trace_options.process_name = source.title;
    writeOutput(o.trace, sch::chromeTraceText(shown, program.num_ranks, trace_options),
                "Chrome trace");
    std::cout << "wrote " << o.trace << " (open in https://ui.perfetto.dev)\n";
  }
  if (!o.svg.empty()) {
    sch::SvgTimelineOptions svg_options;
    svg_options.title =
        source.title + (timed ? ", " + sch::describeCostModel(*source.costs) : ", unit steps");
    writeOutput(o.svg, sch::svgTimeline(shown, program.num_ranks, program.stage_to_rank, svg_options),
                "SVG timeline");
    std::cout << "wrote " << o.svg << "\n";
  }
}

void writeFiles(const ScheduleOptions& o, const ScheduleSource& source,
                const std::optional<sch::CostSimulation>& timed) {
  if (!o.csv.empty()) {
    writeOutput(o.csv, sch::programToCsv(source.program), "schedule CSV");
    std::cout << "wrote " << o.csv << "\n";
  }
  if (!o.trace.empty() || !o.svg.empty()) writeTimelines(o, source, timed);
}

int runSchedule(const ScheduleOptions& o) {
  checkOptions(o);
  const MemoryOptions memory = readMemoryOptions(o.act_mem, o.mem_limit, !o.cost_file.empty());
  ScheduleSource source = o.name.empty() ? scheduleFromFile(o, memory) : scheduleFromName(o, memory);
  sch::validateProgram(source.program);
  if (o.lower) {
    source.program = sch::lowerForExecution(source.program);
    source.title += ", lowered";
  }
  printGrid(source.program, source.title);
  std::optional<sch::CostSimulation> timed;
  if (source.costs) timed = sch::simulateCost(source.program, *source.costs);
  if (o.simulate) printSimulation(source.program, source.costs, timed, memory);
  if (timed && memory.mem_limit && !source.is_auto) checkPeakMemory(*timed, *memory.mem_limit, memory);
  writeFiles(o, source, timed);
  return kExitOk;
}

}  // namespace

void addScheduleCommand(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<ScheduleOptions>();
  auto* sub = app.add_subcommand(
      "schedule",
      "Generate (or load) a pipeline schedule, print its step grid, lower it, simulate it and "
      "draw it.\nExamples:\n"
      "  pipeforge schedule --name 1F1B --ranks 4 --stages 4 --microbatches 8 --simulate\n"
      "  pipeforge schedule --name auto --ranks 4 --stages 8 --microbatches 16 "
      "--costs 1,1.3,0.7,0.1 --mem-limit 8 --svg auto.svg\n"
      "  pipeforge schedule --load sched.csv --format compute_only --lower --csv lowered.csv\n"
      "Times are in the unit of --costs (read as milliseconds in traces). Memory is in "
      "microbatch activations (1 = one microbatch's activations on one stage), in --act-mem's unit, "
      "or in bytes when --act-mem has a byte unit (--act-mem 512MiB --mem-limit 8GiB).\n"
      "The grid shows each rank's actions in list order; the unit-time simulation counts steps "
      "of the schedule lowered to SEND/RECV, where messages and waits take steps too.");
  sub->add_option("--name", o->name,
                  fmt::format("schedule: {}, or auto (search for the fastest under --costs and --mem-limit)",
                              fmt::join(schedules::scheduleNames(), ", ")));
  sub->add_option("--ranks", o->ranks, "pipeline ranks P");
  sub->add_option("--stages", o->stages, "total stages S (a multiple of P; S/P per rank)");
  sub->add_option("--microbatches", o->microbatches, "microbatches M per step");
  sub->add_option("--microbatch-group-size", o->microbatch_group_size,
                  "MegatronInterleaved: Megatron's microbatch_group_size_per_vp_stage, the microbatches run "
                  "on one model chunk before the next (default: --ranks)");
  sub->add_option("--load", o->load, "read the schedule from a PyTorch-format CSV instead");
  sub->add_option("--format", o->format,
                  "CSV flavour for --load: compute_only (default) or compute_comms");
  sub->add_option("--costs", o->costs,
                  "durations F,I,W and optionally the comm latency C, e.g. 1,1.3,0.7,0.1 "
                  "(B = I + W)");
  sub->add_option("--cost-file", o->cost_file,
                  "per-stage costs as JSON ({\"stages\": [{\"forward\": 1, ...}], "
                  "\"comm_latency\": 0.1}; also send_overhead, recv_overhead and action_overhead: "
                  "what a message costs each side and the runtime per action)");
  sub->add_option("--mem-limit", o->mem_limit,
                  "peak activation memory per rank, in --act-mem's unit (bytes: 8GiB): auto stays below "
                  "it, a named schedule above it is an error");
  sub->add_option("--act-mem", o->act_mem,
                  "activation memory of one microbatch on a stage: a number (default 1) or bytes (512MiB)");
  sub->add_option("--w-share", o->w_share,
                  "share of that memory kept from I until W when the backward is split (0.5)");
  sub->add_option("--layout", o->layout, "stage layout for --name auto: loop (default) or v");
  sub->add_option("--time-unit-us", o->time_unit_us,
                  "microseconds per time unit in --trace (1000: costs in milliseconds)");
  sub->add_flag("--lower", o->lower, "insert SEND/RECV (and merge adjacent I,W into B)");
  sub->add_flag("--simulate", o->simulate,
                "print the unit-time step count and, with costs, makespan, bubbles and memory");
  sub->add_option("--csv", o->csv, "write the schedule as PyTorch CSV");
  sub->add_option("--trace", o->trace, "write a Chrome/Perfetto trace (JSON)");
  sub->add_option("--svg", o->svg, "write an SVG timeline");
  sub->callback([o, &exit_code] {
    exit_code = runGuarded("schedule", [&] { return runSchedule(*o); });  // UsageError: exit 2
  });
}

}  // namespace pipeforge::cli
