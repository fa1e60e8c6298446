// What a YAML syntax error means, said in the user's terms.
//
// yaml-cpp reports "illegal map value" or "end of map not found" at the
// position where it gave up, which is often the line after the mistake. The
// config and split-spec readers hand its report to describeYamlError, which
// looks at the text around that position for the usual causes and names the
// line that has them:
//   t.yaml:3: a tab in the indentation; YAML indents with spaces
//   t.yaml:12: `schedule:` is indented deeper than `microbatches: 4` (line 11),
//              which has a value already; indent it as its siblings
//   t.yaml:2: '[' is never closed; close it with ']'
//   t.yaml:1: a second ': ' in `a: b: c`; quote a value that contains ': '
// Anything else keeps yaml-cpp's words, with the line and column.
#pragma once

#include <string>

namespace pipeforge {

// `line` and `column` are yaml-cpp's mark (0-based; -1 when unknown), `what`
// its message. Returns "<origin>:<line>: <explanation>".
std::string describeYamlError(const std::string& text, const std::string& origin, int line, int column,
                              const std::string& what);

}  // namespace pipeforge
