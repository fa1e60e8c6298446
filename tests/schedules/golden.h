// The interop golden files (tests/schedules/golden/, PyTorch's artifacts).
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

namespace pipeforge::schedules::testing {

// The whole file `name`; a missing file fails the calling test.
inline std::string readGolden(const std::string& name) {
  std::ifstream in(std::string(PIPEFORGE_INTEROP_DIR) + "/" + name, std::ios::binary);
  EXPECT_TRUE(in) << "missing golden file " << name;
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace pipeforge::schedules::testing
