// Fuzzes the action parser (schedules/action.h): any text either parses or
// throws ScheduleError; what parses prints in canonical form and parses back
// equal (actions round-trip through text).
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_support.h"
#include "schedules/action.h"
#include "schedules/program.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace pf = pipeforge;
  namespace sch = pf::schedules;
  constexpr const char* kTarget = "action";
  const std::string text = pf::fuzz::textOf(data, size);
  sch::Action action;
  try {
    action = sch::parseAction(text);
  } catch (const sch::ScheduleError& e) {
    pf::fuzz::noteRejected(kTarget, e);
    return 0;
  } catch (...) {
    pf::fuzz::failOnUndocumentedException(kTarget, "parseAction");
  }
  pf::fuzz::noteAccepted(kTarget);
  std::string printed;
  sch::Action back;
  try {
    printed = sch::formatAction(action);
    back = sch::parseAction(printed);
  } catch (...) {
    pf::fuzz::failOnUndocumentedException(kTarget, "formatAction -> parseAction round trip");
  }
  if (back != action) pf::fuzz::failProperty(kTarget, "'" + printed + "' does not parse back to the action it prints");
  if (sch::formatAction(back) != printed) pf::fuzz::failProperty(kTarget, "'" + printed + "' is not canonical");
  return 0;
}
