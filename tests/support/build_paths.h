// Where this build put what the tests use: the pipeforge binary, the zoos,
// the source tree. Read from one torch-free translation unit.
//
// Note [Paths out of the command line]: a path given to every test file as a
// -D definition differs between two clones of the repository, so ccache
// (CCACHE_BASEDIR rewrites arguments, not the text of a definition) missed
// every test file of a fresh clone: CI recompiled them all on each run. Only
// build_paths.cpp is compiled with the paths now; the macros below keep the
// tests' spelling and cost a function call.
#pragma once

namespace pipeforge::testing::paths {

const char* sourceDir();           // the repository root
const char* binaryDir();           // the CMake build folder
const char* zooDir();              // <build>/zoo (tests/models/generate_zoo.py)
const char* pt2ZooDir();           // <build>/zoo_pt2
const char* legacyZooDir();        // <build>/zoo-legacy, or "" where no older torch saved one
const char* legacyTorchVersion();  // the torch that saved it, or ""
const char* pythonTorchVersion();  // PIPEFORGE_PYTHON's torch ("2.13.0")
const char* python();              // PIPEFORGE_PYTHON
const char* pipeforgeBinary();     // the `pipeforge` executable
const char* runtimeWorker();       // tests/runtime/runtime_worker
const char* runtimeSplits();       // <build>/runtime_splits

}  // namespace pipeforge::testing::paths

#define PIPEFORGE_SOURCE_DIR (::pipeforge::testing::paths::sourceDir())
#define PIPEFORGE_BINARY_DIR (::pipeforge::testing::paths::binaryDir())
#define PIPEFORGE_ZOO_DIR (::pipeforge::testing::paths::zooDir())
#define PIPEFORGE_PT2_ZOO_DIR (::pipeforge::testing::paths::pt2ZooDir())
#define PIPEFORGE_LEGACY_ZOO_DIR (::pipeforge::testing::paths::legacyZooDir())
#define PIPEFORGE_LEGACY_TORCH_VERSION (::pipeforge::testing::paths::legacyTorchVersion())
#define PIPEFORGE_PYTHON_TORCH_VERSION (::pipeforge::testing::paths::pythonTorchVersion())
#define PIPEFORGE_PYTHON (::pipeforge::testing::paths::python())
#define PIPEFORGE_BINARY (::pipeforge::testing::paths::pipeforgeBinary())
#define PIPEFORGE_RUNTIME_WORKER (::pipeforge::testing::paths::runtimeWorker())
#define PIPEFORGE_RUNTIME_SPLITS (::pipeforge::testing::paths::runtimeSplits())
