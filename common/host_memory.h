// How this process's malloc treats freed memory (Note [Freed memory stays in
// the process]).
//
// Note [Freed memory stays in the process]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// LibTorch's CPU tensors come from malloc. glibc serves large blocks (above
// its mmap threshold: 128 KiB at first, raised as such blocks are freed)
// with fresh mappings, and returns free memory at the top of the heap to the
// kernel past its trim threshold. Either way the next block of that size is
// new memory: page faults and zeroed pages on first touch. A training step
// allocates and frees the same activation and gradient sizes in every
// microbatch, and split backward's I keeps its graph while it allocates
// (Note [Split backward]), so it pays this most. A rank therefore keeps
// what it freed: blocks up to 32 MiB come from the heap, the heap is not
// trimmed below 1 GiB of free top, and it grows 64 MiB at a time. Peak RSS
// is what the step needs either way; free memory just is not given back.
// A user's own choice wins: with any MALLOC_* variable, GLIBC_TUNABLES, or
// LD_PRELOAD (jemalloc, tcmalloc) set, nothing is changed. Not glibc:
// nothing is changed.
#pragma once

namespace pipeforge {

// Applies the settings above once; true when it changed them.
bool keepFreedHostMemory();

// Whether `environment` (NAME=value entries, null-terminated, as `environ`)
// already says how malloc behaves: a MALLOC_* variable, GLIBC_TUNABLES or
// LD_PRELOAD.
bool allocatorChosenByEnvironment(const char* const* environment);

}  // namespace pipeforge
