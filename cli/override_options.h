// The config-override options of `train` and `eval` (Note [Config overrides]
// in config/config_overrides.h): `--set KEY=VALUE`, repeatable, and the
// dotted `--section.key VALUE` words, which CLI11 passes through as extras.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config/config_overrides.h"

namespace CLI {
class App;
}

namespace pipeforge::cli {

class OverrideOptions {
 public:
  // Adds --set to `sub` and lets `sub` keep words it does not know.
  explicit OverrideOptions(CLI::App* sub);

  // Inside the subcommand's callback: every override given. Throws
  // pipeforge::Error (kUsage) for a word that is no override, or a key given
  // twice (also as a section and a key inside it).
  std::vector<train::ConfigOverride> collect() const;

 private:
  CLI::App* sub_;
  std::shared_ptr<std::vector<std::string>> set_args_;
};

}  // namespace pipeforge::cli
