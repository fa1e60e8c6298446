// How `pipeforge schedule` reads --act-mem and --mem-limit, and names the unit
// of every memory number it prints.
#pragma once

#include <optional>
#include <string>

namespace pipeforge::cli {

// What the memory numbers count. The simulators add up each stage's
// activation_memory, so their results are in whatever unit that was given in:
// by default 1 stands for one microbatch's activations on one stage; --act-mem
// with a byte unit makes every memory number a size in bytes.
struct MemoryUnit {
  bool bytes = false;
  std::string name = "microbatch activations (1 = one microbatch's activations on one stage)";  // unless bytes

  // "2.5", or "6.5 GiB" in bytes.
  std::string format(double value) const;
};

// --act-mem and --mem-limit as numbers, in one unit.
struct MemoryOptions {
  std::optional<double> act_mem;
  std::optional<double> mem_limit;
  MemoryUnit unit;
};

// Throws UsageError for a value that is neither a positive number nor a byte
// size, and for a mix of the two (--act-mem 512MiB --mem-limit 8).
MemoryOptions readMemoryOptions(const std::string& act_mem, const std::string& mem_limit, bool has_cost_file);

}  // namespace pipeforge::cli
