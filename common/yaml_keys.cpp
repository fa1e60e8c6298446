#include "common/yaml_keys.h"

#include <map>

#include <yaml-cpp/yaml.h>

namespace pipeforge {
namespace {

std::string lineOf(const YAML::Node& node) {
  const auto mark = node.Mark();
  return mark.line < 0 ? std::string("?") : std::to_string(mark.line + 1);
}

std::optional<std::string> search(const YAML::Node& node, const std::string& path, const std::string& origin) {
  if (node.IsSequence()) {
    for (std::size_t i = 0; i < node.size(); ++i) {
      if (auto found = search(node[i], path + "[" + std::to_string(i) + "]", origin)) return found;
    }
    return std::nullopt;
  }
  if (!node.IsMap()) return std::nullopt;
  std::map<std::string, YAML::Node> seen;
  for (const auto& kv : node) {
    if (!kv.first.IsScalar()) continue;  // a list or map as a key: the readers refuse it themselves
    const std::string name = kv.first.Scalar();
    const std::string key = path.empty() ? name : path + "." + name;
    auto [it, fresh] = seen.emplace(name, kv.first);
    if (!fresh) {
      return origin + ":" + lineOf(kv.first) + ": '" + key + "' appears twice (first at line " + lineOf(it->second) +
             "); keep one";
    }
    if (auto found = search(kv.second, key, origin)) return found;
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> findDuplicateKey(const YAML::Node& root, const std::string& origin) {
  return search(root, "", origin);
}

}  // namespace pipeforge
