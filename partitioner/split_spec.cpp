#include "partitioner/split_spec.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>
#include <sstream>

#include "common/dtype_names.h"
#include "common/yaml_errors.h"
#include "common/yaml_keys.h"

namespace pipeforge::partitioner {
namespace {

std::string where(const std::string& origin, const YAML::Node& node) {
  auto mark = node.Mark();
  if (mark.line < 0) return origin;
  return origin + ":" + std::to_string(mark.line + 1);
}

// A map key as text. YAML also allows lists and maps as keys (`? [a, b]: 1`);
// no key of a split spec is one, and yaml-cpp would throw its own exception.
std::string keyText(const YAML::Node& key, const std::string& origin) {
  if (key.IsSequence() || key.IsMap()) {
    throw SpecError(where(origin, key) + ": a key must be a name such as num_stages or layers.1, got a " +
                    (key.IsMap() ? "map" : "list"));
  }
  return key.as<std::string>();
}

template <typename T>
T scalarAs(const YAML::Node& node, const std::string& key, const char* expected, const std::string& origin) {
  try {
    return node.as<T>();
  } catch (const YAML::Exception&) {
    throw SpecError(where(origin, node) + ": '" + key + "' must be " + expected);
  }
}

ExampleInput parseExampleInput(const YAML::Node& node, size_t index, const std::string& origin) {
  std::string key = "example_inputs[" + std::to_string(index) + "]";
  if (!node.IsMap()) {
    throw SpecError(where(origin, node) + ": " + key + " must be a map like {shape: [8, 128], dtype: int64, high: 100}");
  }
  ExampleInput in;
  bool has_shape = false;
  for (const auto& kv : node) {
    auto name = keyText(kv.first, origin);
    if (name == "shape") {
      if (!kv.second.IsSequence()) throw SpecError(where(origin, kv.second) + ": " + key + ".shape must be a list of sizes");
      for (const auto& d : kv.second) {
        auto size = scalarAs<int64_t>(d, key + ".shape", "a list of non-negative integers", origin);
        if (size < 0) throw SpecError(where(origin, d) + ": " + key + ".shape has negative size " + std::to_string(size));
        in.shape.push_back(size);
      }
      has_shape = true;
    } else if (name == "dtype") {
      in.dtype = scalarAs<std::string>(kv.second, key + ".dtype", "a string", origin);
      auto dtype = parseDtype(in.dtype);
      if (!dtype) {
        throw SpecError(where(origin, kv.second) + ": " + key + ".dtype '" + in.dtype + "' is not supported; use " +
                        dtypeChoices() + " (or PyTorch's names: float, double, half, long, int)");
      }
      in.dtype = dtypeName(*dtype);
    } else if (name == "low") {
      in.low = scalarAs<double>(kv.second, key + ".low", "a number", origin);
    } else if (name == "high") {
      in.high = scalarAs<double>(kv.second, key + ".high", "a number", origin);
    } else {
      throw SpecError(where(origin, kv.first) + ": unknown key '" + key + "." + name +
                      "'; an example input takes shape, dtype, low and high");
    }
  }
  if (!has_shape) throw SpecError(where(origin, node) + ": " + key + " needs a shape, e.g. {shape: [8, 128]}");
  return in;
}

bool isIdentifier(const std::string& name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

// `constant_inputs: {scale: 2.0, sizes: [2, 3], mode: mean, bias: null}`:
// the values stay text until the model's forward gives their types.
std::vector<ConstantInput> parseConstantInputs(const YAML::Node& value, const std::string& origin) {
  std::vector<ConstantInput> out;
  if (value.IsNull()) return out;
  if (!value.IsMap()) {
    throw SpecError(where(origin, value) + ": constant_inputs must map forward's non-tensor arguments to values, "
                    "e.g. 'constant_inputs: {scale: 2.0}'");
  }
  std::set<std::string> seen;
  for (const auto& kv : value) {
    ConstantInput c;
    c.name = keyText(kv.first, origin);
    c.where = where(origin, kv.second);
    const std::string key = "constant_inputs." + c.name;
    if (!isIdentifier(c.name)) {
      throw SpecError(where(origin, kv.first) + ": " + key + ": '" + c.name +
                      "' is not an argument name; name an argument of forward, e.g. 'scale: 2.0'");
    }
    if (!seen.insert(c.name).second) {
      throw SpecError(where(origin, kv.first) + ": " + key + " is given twice; keep one");
    }
    const YAML::Node& v = kv.second;
    if (v.IsNull()) {
      c.kind = ConstantInput::Kind::kNull;
    } else if (v.IsScalar()) {
      c.items.push_back(v.Scalar());
    } else if (v.IsSequence()) {
      c.kind = ConstantInput::Kind::kList;
      for (const auto& item : v) {
        if (!item.IsScalar()) {
          throw SpecError(where(origin, item) + ": " + key + " must be a list of numbers, e.g. [2, 3]");
        }
        c.items.push_back(item.Scalar());
      }
    } else {
      throw SpecError(where(origin, v) + ": " + key +
                      " must be an int, float, bool, string, null or a list of numbers, not a map");
    }
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

const char* policyName(Policy policy) {
  switch (policy) {
    case Policy::kNone: return "none";
    case Policy::kParameters: return "parameters";
    case Policy::kCost: return "cost";
    case Policy::kUniform: return "uniform";
  }
  return "?";
}

SplitSpec parseSplitSpec(const std::string& yaml_text, const std::string& origin) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw SpecError(describeYamlError(yaml_text, origin, e.mark.line, e.mark.column, e.msg));
  }
  if (auto duplicate = findDuplicateKey(root, origin)) throw SpecError(*duplicate);
  return parseSplitSpecNode(root, origin);
}

SplitSpec parseSplitSpecNode(const YAML::Node& root, const std::string& origin) {
  SplitSpec spec;
  if (root.IsNull()) return spec;
  if (!root.IsMap()) {
    throw SpecError(origin + ": a split spec is a YAML map with split_points, num_stages, policy, example_inputs, "
                    "constant_inputs");
  }
  for (const auto& kv : root) {
    auto key = keyText(kv.first, origin);
    const YAML::Node& value = kv.second;
    if (key == "split_points") {
      if (value.IsNull()) continue;
      if (!value.IsMap()) {
        throw SpecError(where(origin, value) + ": split_points must map FQNs to BEGINNING or END, e.g. 'layers.1: BEGINNING'");
      }
      for (const auto& point : value) {
        auto fqn = keyText(point.first, origin);
        auto kind = scalarAs<std::string>(point.second, "split_points." + fqn, "BEGINNING or END", origin);
        SplitPoint sp;
        if (kind == "BEGINNING" || kind == "beginning") {
          sp = SplitPoint::kBeginning;
        } else if (kind == "END" || kind == "end") {
          sp = SplitPoint::kEnd;
        } else {
          throw SpecError(where(origin, point.second) + ": split_points." + fqn + " is '" + kind +
                          "'; a SplitPoint is BEGINNING or END");
        }
        spec.split_points.emplace_back(fqn, sp);
      }
    } else if (key == "num_stages") {
      int n = scalarAs<int>(value, key, "an integer >= 1", origin);
      if (n < 1) throw SpecError(where(origin, value) + ": num_stages must be >= 1, got " + std::to_string(n));
      spec.num_stages = n;
    } else if (key == "policy") {
      auto name = scalarAs<std::string>(value, key, "a string", origin);
      if (name == "parameters") {
        spec.policy = Policy::kParameters;
      } else if (name == "cost") {
        spec.policy = Policy::kCost;
      } else if (name == "uniform") {
        spec.policy = Policy::kUniform;
      } else {
        throw SpecError(where(origin, value) + ": unknown policy '" + name + "'; use parameters, cost or uniform");
      }
    } else if (key == "example_inputs") {
      if (!value.IsSequence()) {
        throw SpecError(where(origin, value) + ": example_inputs must be a list, one entry per forward argument");
      }
      for (size_t i = 0; i < value.size(); ++i) spec.example_inputs.push_back(parseExampleInput(value[i], i, origin));
    } else if (key == "constant_inputs") {
      spec.constant_inputs = parseConstantInputs(value, origin);
    } else {
      throw SpecError(where(origin, kv.first) + ": unknown key '" + key +
                      "'; a split spec takes split_points, num_stages, policy, example_inputs and constant_inputs");
    }
  }
  if (spec.policy != Policy::kNone && !spec.num_stages) {
    throw SpecError(origin + ": policy '" + policyName(spec.policy) + "' needs num_stages");
  }
  if (spec.policy == Policy::kCost && spec.example_inputs.empty()) {
    throw SpecError(origin + ": policy 'cost' measures the model, so it needs example_inputs");
  }
  return spec;
}

SplitSpec loadSplitSpec(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw SpecError("split spec '" + path + "' cannot be read; check the path");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return parseSplitSpec(buffer.str(), path);
}

}  // namespace pipeforge::partitioner
