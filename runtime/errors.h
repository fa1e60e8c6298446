// The runtime's error type for everything a user can cause.
#pragma once

#include <stdexcept>

namespace pipeforge::runtime {

// Every error a user can cause (bad options, a split that does not fit the
// schedule, a batch of the wrong form, a peer that failed) is a RuntimeError
// whose message says what, where, and how to fix it.
class RuntimeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace pipeforge::runtime
