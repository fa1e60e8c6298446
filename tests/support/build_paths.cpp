// Compiled with the build's paths as PF_PATH_* definitions (tests/CMakeLists.txt),
// Note [Paths out of the command line].
#include "tests/support/build_paths.h"

namespace pipeforge::testing::paths {

const char* sourceDir() { return PF_PATH_SOURCE_DIR; }
const char* binaryDir() { return PF_PATH_BINARY_DIR; }
const char* zooDir() { return PF_PATH_ZOO_DIR; }
const char* pt2ZooDir() { return PF_PATH_PT2_ZOO_DIR; }
const char* legacyZooDir() { return PF_PATH_LEGACY_ZOO_DIR; }
const char* legacyTorchVersion() { return PF_PATH_LEGACY_TORCH_VERSION; }
const char* pythonTorchVersion() { return PF_PATH_PYTHON_TORCH_VERSION; }
const char* python() { return PF_PATH_PYTHON; }
const char* pipeforgeBinary() { return PF_PATH_PIPEFORGE_BINARY; }
const char* runtimeWorker() { return PF_PATH_RUNTIME_WORKER; }
const char* runtimeSplits() { return PF_PATH_RUNTIME_SPLITS; }

}  // namespace pipeforge::testing::paths
