// Fuzzes the schedule CSV reader (schedules/csv.h) along the path of
// `pipeforge schedule --load IN.csv [--lower] [--simulate]`: parse, infer the
// program, validate it, and for a valid compute-only program lower it and
// simulate it. Every rejection must be a ScheduleError; CSV text that parses
// must round-trip through formatCsv / programToCsv.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_support.h"
#include "schedules/csv.h"
#include "schedules/format_grid.h"
#include "schedules/lower.h"
#include "schedules/program.h"
#include "schedules/simulate_unit.h"
#include "schedules/validate.h"

namespace {

namespace pf = pipeforge;
namespace sch = pf::schedules;
constexpr const char* kTarget = "schedule_csv";

void checkGridRoundTrip(const std::string& text) {
  sch::ActionGrid grid;
  try {
    grid = sch::parseCsv(text);
  } catch (const sch::ScheduleError&) {
    return;
  } catch (...) {
    pf::fuzz::failOnUndocumentedException(kTarget, "parseCsv");
  }
  std::string written;
  sch::ActionGrid back;
  try {
    written = sch::formatCsv(grid);
    back = sch::parseCsv(written);
  } catch (...) {
    pf::fuzz::failOnUndocumentedException(kTarget, "formatCsv -> parseCsv round trip");
  }
  if (back != grid) pf::fuzz::failProperty(kTarget, "the grid does not survive formatCsv/parseCsv:\n" + written);
}

// What the CLI does with a loaded program; a ScheduleError ends it early.
void runLoadedProgram(const sch::Program& loaded) {
  try {
    sch::validateProgram(loaded);
    (void)sch::formatGrid(loaded);
    if (!sch::isComputeOnly(loaded)) {
      (void)sch::simulateUnit(loaded);
      return;
    }
    const sch::Program lowered = sch::lowerForExecution(loaded);
    (void)sch::formatGrid(lowered);
    (void)sch::simulateUnit(lowered);
  } catch (const sch::ScheduleError& e) {
    pf::fuzz::noteRejected(kTarget, e);
  } catch (...) {
    pf::fuzz::failOnUndocumentedException(kTarget, "validate/lower/simulate of a loaded program");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text = pf::fuzz::textOf(data, size);
  checkGridRoundTrip(text);

  sch::Program program;
  try {
    program = sch::programFromCsv(text);
  } catch (const sch::ScheduleError& e) {
    pf::fuzz::noteRejected(kTarget, e);
    return 0;
  } catch (...) {
    pf::fuzz::failOnUndocumentedException(kTarget, "programFromCsv");
  }
  pf::fuzz::noteAccepted(kTarget);
  std::string written;
  sch::Program back;
  try {
    written = sch::programToCsv(program);
    back = sch::programFromCsv(written);
  } catch (...) {
    pf::fuzz::failOnUndocumentedException(kTarget, "programToCsv -> programFromCsv round trip");
  }
  if (!(back == program)) pf::fuzz::failProperty(kTarget, "the program does not survive programToCsv/programFromCsv");
  runLoadedProgram(program);
  return 0;
}
