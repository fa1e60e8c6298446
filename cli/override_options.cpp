#include "cli/override_options.h"

#include <CLI/CLI.hpp>

#include <fmt/format.h>

#include "common/error.h"

namespace pipeforge::cli {
namespace {

// "training" covers "training.steps"; a key covers itself.
bool covers(const std::string& outer, const std::string& inner) {
  return inner == outer || (inner.size() > outer.size() && inner.compare(0, outer.size(), outer) == 0 &&
                            inner[outer.size()] == '.');
}

}  // namespace

OverrideOptions::OverrideOptions(CLI::App* sub)
    : sub_(sub), set_args_(std::make_shared<std::vector<std::string>>()) {
  sub->add_option("--set", *set_args_,
                  "override a config key: --set training.steps=5 (repeatable; the value is YAML, checked as the "
                  "file's keys are). Also written --training.steps 5")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->type_name("KEY=VALUE");
  sub->allow_extras();
}

std::vector<train::ConfigOverride> OverrideOptions::collect() const {
  std::vector<train::ConfigOverride> all;
  for (const std::string& text : *set_args_) all.push_back(train::parseSetArgument(text));
  for (train::ConfigOverride& o : train::parseDottedArguments(sub_->remaining())) all.push_back(std::move(o));
  // Applied in any order, the result is the same: no key is given twice.
  for (std::size_t i = 0; i < all.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (covers(all[j].key, all[i].key) || covers(all[i].key, all[j].key)) {
        throw Error(ErrorCode::kUsage, fmt::format("'{}' and '{}' both set {}; give it once", all[j].as_written,
                                                   all[i].as_written,
                                                   all[i].key.size() < all[j].key.size() ? all[i].key : all[j].key));
      }
    }
  }
  return all;
}

}  // namespace pipeforge::cli
