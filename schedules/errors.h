// schedules/'s error type. Its own header, so the IR's leaves (action,
// format_grid) report problems without including the program they belong to.
#pragma once

#include <string>

#include "common/error.h"

namespace pipeforge::schedules {

// Every user-caused schedule problem (bad text, bad CSV, invalid or
// deadlocking schedule, rejected configuration) is reported with this type.
class ScheduleError : public pipeforge::Error {
 public:
  explicit ScheduleError(const std::string& message, ErrorCode code = ErrorCode::kUserInput) : Error(code, message) {}
};

}  // namespace pipeforge::schedules
