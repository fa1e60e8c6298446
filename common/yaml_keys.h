// Checks on YAML documents that yaml-cpp does not make: a key written twice in
// one map is kept twice, and the last one silently wins when a reader walks the
// map. Configs and split specs refuse it instead, naming both lines.
#pragma once

#include <optional>
#include <string>

namespace YAML {
class Node;
}

namespace pipeforge {

// The first key that appears twice in one map anywhere in `root`, as a
// message: "<origin>:7: 'data.block_size' appears twice (first at line 5);
// keep one". nullopt when every map's keys are distinct.
std::optional<std::string> findDuplicateKey(const YAML::Node& root, const std::string& origin);

}  // namespace pipeforge
