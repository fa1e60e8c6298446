// The split spec: where to cut a model into stages (YAML, see configs/).
//
//   split_points:            # FQN -> BEGINNING | END, any depth
//     layers.1: BEGINNING
//   num_stages: 4            # and/or an automatic policy
//   policy: parameters       # parameters | cost | uniform
//   example_inputs:          # shape propagation and the cost policy
//     - {shape: [8, 128], dtype: int64, high: 50000}
//   constant_inputs:         # values baked in for forward's non-tensor arguments
//     scale: 2.0
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"

namespace YAML {
class Node;
}

namespace pipeforge::partitioner {

class SpecError : public pipeforge::Error {
 public:
  explicit SpecError(const std::string& message, ErrorCode code = ErrorCode::kUserInput) : Error(code, message) {}
};

enum class SplitPoint { kBeginning, kEnd };
enum class Policy { kNone, kParameters, kCost, kUniform };

struct ExampleInput {
  std::vector<int64_t> shape;
  std::string dtype = "float32";  // float32 | float64 | float16 | bfloat16 | int64 | int32 | bool
  double low = 0.0;                // integers: uniform in [low, high); floats: normal when low == high == 0
  double high = 0.0;
};

// A value for a non-tensor argument of forward (`constant_inputs`), kept as
// the YAML gave it: only the model's forward says which type it must have,
// so stage/constant_inputs.cpp converts and checks it when the model is split.
struct ConstantInput {
  enum class Kind { kNull, kScalar, kList };
  std::string name;
  Kind kind = Kind::kScalar;
  std::vector<std::string> items;  // kScalar: its text; kList: one text per element; kNull: none
  std::string where;               // "spec.yaml:4", for errors at split time
};

struct SplitSpec {
  std::vector<std::pair<std::string, SplitPoint>> split_points;  // in file order
  std::optional<int> num_stages;
  Policy policy = Policy::kNone;
  std::vector<ExampleInput> example_inputs;
  std::vector<ConstantInput> constant_inputs;  // in file order
};

const char* policyName(Policy policy);

// Parses YAML text; `origin` names the file in errors. Unknown keys, bad
// values and malformed YAML throw SpecError naming the key and the fix.
SplitSpec parseSplitSpec(const std::string& yaml_text, const std::string& origin);
// The same from a YAML map already parsed, e.g. the split keys inline in a
// training config: errors then name that file and the entries' own lines.
SplitSpec parseSplitSpecNode(const YAML::Node& root, const std::string& origin);
SplitSpec loadSplitSpec(const std::string& path);

}  // namespace pipeforge::partitioner
