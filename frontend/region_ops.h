// The ops the importer emits for the grad-mode and autocast regions of an
// exported program (Note [PT2 regions] in pt2_import.cpp).
//
// A `torch.no_grad()` region uses TorchScript's own aten::is_grad_enabled /
// aten::set_grad_enabled. Autocast has no TorchScript builtin that takes a
// device and dtype, so these two are ours, registered in C++ like the
// pipe_split marker:
//
//   %state : int[] = pipeforge::autocast_enter(device_type, dtype?, enabled, cache_enabled?)
//   ... the region ...
//   = pipeforge::autocast_exit(device_type, %state)
#pragma once

namespace pipeforge::frontend {

inline constexpr const char* kAutocastEnterOpName = "pipeforge::autocast_enter";
inline constexpr const char* kAutocastExitOpName = "pipeforge::autocast_exit";

// Ensures the ops are registered (CONSERVATIVE alias analysis: they change
// thread state, so dead-code elimination and reordering must keep them).
// Calling it also keeps the registering object file linked. Idempotent.
void ensureRegionOpsRegistered();

}  // namespace pipeforge::frontend
