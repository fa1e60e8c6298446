// YAML syntax errors explained (common/yaml_errors.h): each usual mistake is
// parsed by yaml-cpp, and its report turned into the line and the cause.
#include "common/yaml_errors.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

namespace pipeforge {
namespace {

// The message for `text`, which yaml-cpp must refuse.
std::string explain(const std::string& text) {
  try {
    YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return describeYamlError(text, "t.yaml", e.mark.line, e.mark.column, e.msg);
  }
  ADD_FAILURE() << "yaml-cpp accepted:\n" << text;
  return "";
}

TEST(YamlErrorsTest, UsualMistakes) {
  struct Case {
    const char* name;
    std::string text;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"deeper than a sibling with a value", "pipeline:\n  microbatches: 4\n    schedule: 1F1B\ntraining:\n",
       "t.yaml:3: `schedule:` is indented deeper than `microbatches: 4` (line 2), which has a value already; indent "
       "it as its siblings"},
      {"deeper, after a comment and a blank line",
       "model:\n  path: m.pt\npipeline:\n  schedule: 1F1B  # the default\n\n  # why\n      microbatches: 4\n",
       "t.yaml:7: `microbatches:` is indented deeper than `schedule: 1F1B` (line 4)"},
      {"a tab", "pipeline:\n  microbatches: 4\n\tschedule: 1F1B\n",
       "t.yaml:3: a tab in the indentation; YAML indents with spaces"},
      {"a tab, reported on its own line", "pipeline:\n\tmicrobatches: 4\n",
       "t.yaml:2: a tab in the indentation; YAML indents with spaces"},
      {"two colons", "a: b: c\n", "t.yaml:1: a second ': ' in `a: b: c`; quote a value that contains ': '"},
      {"unclosed list", "a: [1, 2\nb: 3\n", "t.yaml:1: '[' is never closed; close it with ']'"},
      {"unclosed map", "x: 1\na: {x: 1\nb: 3\n", "t.yaml:2: '{' is never closed; close it with '}'"},
      {"between section and keys", "pipeline:\n  microbatches: 4\n schedule: 1F1B\n",
       "t.yaml:3: `schedule:` is indented 1 space, between its section `pipeline:` (0) and the keys under it (2)"},
      {"keys after a list", "pipeline:\n  - a\n  b: 1\n",
       "t.yaml:3: `b: 1` mixes a key into the list above it (line 2); one section holds either keys or a list"},
      {"a list after keys", "a:\n  b: 1\n  - c\n",
       "t.yaml:3: `- c` mixes a list item into the keys above it (line 2)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string message = explain(c.text);
    EXPECT_EQ(message.rfind(c.expected, 0), 0u) << message;
  }
}

TEST(YamlErrorsTest, OtherReportsKeepYamlCppsWords) {
  EXPECT_EQ(describeYamlError("a: 1\n", "t.yaml", 0, 3, "something odd"),
            "t.yaml:1: malformed YAML: something odd (column 4)");
  EXPECT_EQ(describeYamlError("", "t.yaml", -1, -1, "odd"), "t.yaml: malformed YAML: odd");
  EXPECT_EQ(describeYamlError("a: 1", "t.yaml", 7, 0, "odd"), "t.yaml:8: malformed YAML: odd (column 1)");
}

}  // namespace
}  // namespace pipeforge
