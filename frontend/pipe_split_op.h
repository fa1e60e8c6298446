// The `pipeforge::pipe_split()` marker op, as registered in C++.
//
// Scripted models saved with python/pipeforge's pipe_split() reference this
// op; loading them fails with "Unknown builtin op" unless it is registered.
#pragma once

namespace pipeforge::frontend {

inline constexpr const char* kPipeSplitOpName = "pipeforge::pipe_split";

// Ensures the op is registered (CONSERVATIVE alias analysis, so dead-code
// elimination keeps it). Calling it also keeps the registering object file
// linked into static builds. Idempotent.
void ensurePipeSplitRegistered();

}  // namespace pipeforge::frontend
