#include "config/config_overrides.h"

#include <yaml-cpp/yaml.h>

#include <fmt/format.h>

#include "config/train_config.h"

namespace pipeforge::train {
namespace {

Error usageError(const std::string& message) { return Error(ErrorCode::kUsage, message); }

// "training.steps" -> {"training", "steps"}; empty when a part is empty.
std::vector<std::string> keyParts(const std::string& key) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = key.find('.', start);
    parts.push_back(key.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (parts.back().empty()) return {};
    if (dot == std::string::npos) return parts;
    start = dot + 1;
  }
}

// The key node of `name` in `map` (after it was inserted).
YAML::Node keyNode(const YAML::Node& map, const std::string& name) {
  for (const auto& kv : map) {
    if (kv.first.IsScalar() && kv.first.Scalar() == name) return kv.first;
  }
  return YAML::Node();
}

void labelTree(const YAML::Node& node, const std::string& label, OverrideLabels& labels) {
  labels.emplace_back(node, label);
  if (node.IsSequence()) {
    for (const auto& item : node) labelTree(item, label, labels);
  } else if (node.IsMap()) {
    for (const auto& kv : node) {
      labels.emplace_back(kv.first, label);
      labelTree(kv.second, label, labels);
    }
  }
}

std::string locate(const YAML::Node& node, const std::string& origin) {
  const auto mark = node.Mark();
  return mark.line < 0 ? origin : fmt::format("{}:{}", origin, mark.line + 1);
}

}  // namespace

ConfigOverride parseSetArgument(const std::string& text) {
  const std::size_t eq = text.find('=');
  const std::string as_written = "--set " + text;
  if (eq == std::string::npos) {
    throw usageError(fmt::format("{}: give KEY=VALUE with the key's full dotted name, e.g. --set training.steps=5",
                                 as_written));
  }
  ConfigOverride o{text.substr(0, eq), text.substr(eq + 1), as_written};
  if (keyParts(o.key).empty()) {
    throw usageError(fmt::format("{}: '{}' is not a key; write the sections and the key joined by dots, e.g. "
                                 "--set training.steps=5",
                                 as_written, o.key));
  }
  return o;
}

std::vector<ConfigOverride> parseDottedArguments(const std::vector<std::string>& words) {
  std::vector<ConfigOverride> out;
  for (std::size_t i = 0; i < words.size(); ++i) {
    const std::string& word = words[i];
    const bool is_option = word.rfind("--", 0) == 0 && word.size() > 2;
    const std::string body = is_option ? word.substr(2) : word;
    const std::size_t eq = body.find('=');
    const std::string key = body.substr(0, eq);
    if (!is_option || key.find('.') == std::string::npos || keyParts(key).empty()) {
      if (!is_option) {
        throw usageError(fmt::format("unexpected argument '{}'; options take one value each (quote a value with "
                                     "spaces)",
                                     word));
      }
      throw usageError(fmt::format("unknown option '{}'; to override a config key, name it with its section: "
                                   "--section.{} VALUE, or --set section.{}=VALUE (e.g. --training.steps 5); "
                                   "`--help` lists the options",
                                   word.substr(0, eq == std::string::npos ? std::string::npos : eq + 2), key, key));
    }
    if (eq != std::string::npos) {
      out.push_back({key, body.substr(eq + 1), word});
      continue;
    }
    if (i + 1 >= words.size() || (words[i + 1].rfind("--", 0) == 0 && words[i + 1].size() > 2)) {
      throw usageError(fmt::format("{} needs a value: --{} VALUE or --{}=VALUE", word, key, key));
    }
    out.push_back({key, words[i + 1], word + " " + words[i + 1]});
    ++i;
  }
  return out;
}

std::vector<std::string> asSetArguments(const std::vector<ConfigOverride>& overrides) {
  std::vector<std::string> args;
  for (const ConfigOverride& o : overrides) {
    args.push_back("--set");
    args.push_back(o.key + "=" + o.value);
  }
  return args;
}

OverrideLabels applyOverrides(YAML::Node& root, const std::vector<ConfigOverride>& overrides,
                              const std::string& origin) {
  OverrideLabels labels;
  if (overrides.empty()) return labels;
  if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  for (const ConfigOverride& o : overrides) {
    YAML::Node value;
    try {
      value = YAML::Load(o.value);
    } catch (const YAML::Exception& e) {
      throw ConfigError(fmt::format("{}: the value is not valid YAML ({}); quote it", o.as_written, e.msg));
    }
    const std::vector<std::string> parts = keyParts(o.key);
    // Walk down with copies of the handles: YAML::Node assignment rebinds, so
    // `map = map[part]` would overwrite the parent.
    std::vector<YAML::Node> path{root};
    std::string walked;
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
      walked += (walked.empty() ? "" : ".") + parts[i];
      const YAML::Node& parent = path.back();
      if (!parent.IsMap()) break;
      YAML::Node child = parent[parts[i]];
      if (!child.IsDefined() || child.IsNull()) {
        YAML::Node fresh(YAML::NodeType::Map);
        YAML::Node slot = parent;  // a handle to the same map
        slot[parts[i]] = fresh;
        labels.emplace_back(keyNode(slot, parts[i]), o.as_written);
        labels.emplace_back(fresh, o.as_written);
        path.push_back(fresh);
      } else if (!child.IsMap()) {
        throw ConfigError(fmt::format("{}: '{}' is not a section at {} (it holds {}), so it has no key '{}'",
                                      o.as_written, walked, locate(child, origin),
                                      child.IsSequence() ? std::string("a list")
                                                         : fmt::format("'{}'", child.Scalar()),
                                      parts[i + 1]));
      } else {
        path.push_back(child);
      }
    }
    YAML::Node parent = path.back();
    const bool existed = parent[parts.back()].IsDefined();
    parent[parts.back()] = value;
    if (!existed) labels.emplace_back(keyNode(parent, parts.back()), o.as_written);
    labelTree(value, o.as_written, labels);
  }
  return labels;
}

}  // namespace pipeforge::train
