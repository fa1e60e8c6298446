// Command-line overrides of training-config keys.
//
// Note [Config overrides]: `pipeforge train --config c.yaml --set
// training.steps=5` (or `--training.steps 5`, the dotted spelling torchtitan
// users know) replaces one key of the file before it is read. The value is
// YAML (`--set pipeline.input_chunks=[0,1]` gives a list), and the key goes
// through the same reader as the file's keys: an unknown key or a wrong type
// is refused with the override as the place, e.g.
//   --set training.stepz=5: unknown key 'training.stepz'; training takes ...
// A key the file lacks is added (with its sections); a section given as a
// scalar in the file cannot take a key. A key given twice on the command
// line (or a section and a key inside it) is refused, as a key written twice
// in the file is, so the order of the overrides never matters. The launcher
// hands them to every rank as `--set KEY=VALUE`, so every rank reads the same
// config.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace YAML {
class Node;
}

namespace pipeforge::train {

struct ConfigOverride {
  std::string key;         // dotted: "training.steps"
  std::string value;       // YAML text: "5"
  std::string as_written;  // for messages: "--set training.steps=5" or "--training.steps 5"
};

// `--set KEY=VALUE`'s argument. Throws UsageError without an '=' or with an
// empty key part ("a..b", ".a").
ConfigOverride parseSetArgument(const std::string& text);

// Command-line words CLI11 did not know, read as dotted overrides:
// `--section.key VALUE` or `--section.key=VALUE`. Anything else (a misspelt
// option, a stray word) throws UsageError naming it, with a hint when it looks
// like a config key without its section.
std::vector<ConfigOverride> parseDottedArguments(const std::vector<std::string>& words);

// The arguments that give `overrides` to another process: --set KEY=VALUE, ...
std::vector<std::string> asSetArguments(const std::vector<ConfigOverride>& overrides);

// Node identities with the override that wrote them, so that messages about
// them point at the command line instead of the file.
using OverrideLabels = std::vector<std::pair<YAML::Node, std::string>>;

// Applies `overrides` to the parsed document `root` (a map; created when the
// file is empty). Returns the labels of every node it wrote. Throws
// ConfigError when a key's parent in the file is not a map, or a value is not
// YAML.
OverrideLabels applyOverrides(YAML::Node& root, const std::vector<ConfigOverride>& overrides,
                              const std::string& origin);

}  // namespace pipeforge::train
