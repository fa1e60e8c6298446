// Runs a subcommand body and turns every escaping exception into one clear
// message and a non-zero exit code, so no raw exception text or abort reaches users.
#pragma once

#include <functional>
#include <string_view>

namespace pipeforge::cli {

int runGuarded(std::string_view command, const std::function<int()>& body);

}  // namespace pipeforge::cli
