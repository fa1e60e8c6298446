// What the inspect tests share: a split spec written to a fresh folder.
#pragma once

#include <fstream>
#include <string>

#include "tests/support/zoo.h"

namespace pipeforge::testing {

// Writes `text` as spec.yaml in a new temporary folder; returns its path.
inline std::string writeSpec(const std::string& text) {
  std::string dir = makeTempDir("pf-inspect");
  std::ofstream(dir + "/spec.yaml") << text;
  return dir + "/spec.yaml";
}

}  // namespace pipeforge::testing
