#include "common/yaml_errors.h"

#include <vector>

namespace pipeforge {
namespace {

std::vector<std::string> splitLines(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
    start = end + 1;
  }
  return lines;
}

std::size_t indentOf(const std::string& line) {
  std::size_t n = 0;
  while (n < line.size() && line[n] == ' ') ++n;
  return n;
}

// Blank lines and comments carry no structure.
bool significant(const std::string& line) {
  const std::size_t first = line.find_first_not_of(" \t");
  return first != std::string::npos && line[first] != '#';
}

std::string trimmed(const std::string& line) {
  const std::size_t first = line.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  std::string out = line.substr(first);
  // Drop a trailing comment (outside quotes is close enough for a message).
  const std::size_t hash = out.find(" #");
  if (hash != std::string::npos) out = out.substr(0, hash);
  while (!out.empty() && (out.back() == ' ' || out.back() == '\t')) out.pop_back();
  return out;
}

// The positions of ": " (or a final ':') that separate keys from values,
// outside quotes and brackets.
std::vector<std::size_t> mapColons(const std::string& s) {
  std::vector<std::size_t> found;
  char quote = 0;
  int depth = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (quote != 0) {
      if (c == quote) quote = 0;
      continue;
    }
    if (c == '#' && (i == 0 || s[i - 1] == ' ')) break;
    if (c == '\'' || c == '"') quote = c;
    if (c == '[' || c == '{') ++depth;
    if ((c == ']' || c == '}') && depth > 0) --depth;
    if (c == ':' && depth == 0 && (i + 1 == s.size() || s[i + 1] == ' ')) found.push_back(i);
  }
  return found;
}

// "schedule:" of "schedule: 1F1B", for messages.
std::string keyText(const std::string& line) {
  const std::string t = trimmed(line);
  const auto colons = mapColons(t);
  return colons.empty() ? t : t.substr(0, colons.front() + 1);
}

// A `key: value` line whose value is on the line (so it opens no block).
bool hasInlineValue(const std::string& line) {
  const std::string t = trimmed(line);
  if (t.rfind("- ", 0) == 0) return false;  // a list item may hold a map below it
  const auto colons = mapColons(t);
  if (colons.empty()) return false;
  const std::string value = trimmed(t.substr(colons.front() + 1));
  return !value.empty() && value[0] != '|' && value[0] != '>' && value[0] != '&' && value[0] != '!';
}

bool isListItem(const std::string& line) {
  const std::string t = trimmed(line);
  return t == "-" || t.rfind("- ", 0) == 0;
}

// The last significant line before `index`, or -1.
int previousSignificant(const std::vector<std::string>& lines, int index) {
  for (int i = index - 1; i >= 0; --i) {
    if (significant(lines[i])) return i;
  }
  return -1;
}

std::string at(const std::string& origin, int line) { return origin + ":" + std::to_string(line + 1) + ": "; }

// The line of the last '[' or '{' before (line, column) that is not closed by then.
std::string unclosedFlow(const std::vector<std::string>& lines, int line, int column, const std::string& origin) {
  std::vector<std::pair<int, char>> open;
  for (int i = 0; i <= line && i < static_cast<int>(lines.size()); ++i) {
    const std::string& s = lines[i];
    const std::size_t end = i == line && column >= 0 ? std::min<std::size_t>(column, s.size()) : s.size();
    char quote = 0;
    for (std::size_t k = 0; k < end; ++k) {
      const char c = s[k];
      if (quote != 0) {
        if (c == quote) quote = 0;
        continue;
      }
      if (c == '#' && (k == 0 || s[k - 1] == ' ')) break;
      if (c == '\'' || c == '"') quote = c;
      if (c == '[' || c == '{') open.emplace_back(i, c);
      if ((c == ']' || c == '}') && !open.empty()) open.pop_back();
    }
  }
  if (open.empty()) return "";
  const auto [where, bracket] = open.back();
  return at(origin, where) + "'" + bracket + "' is never closed; close it with '" + (bracket == '[' ? ']' : '}') +
         "' (keep a flow list or map on one line, or indent its continuation)";
}

}  // namespace

std::string describeYamlError(const std::string& text, const std::string& origin, int line, int column,
                              const std::string& what) {
  const std::vector<std::string> lines = splitLines(text);
  // A tab anywhere in the indentation: YAML forbids it, and yaml-cpp's report
  // of it ("illegal map value", "end of map not found") rarely says so.
  for (int i = 0; i < static_cast<int>(lines.size()); ++i) {
    const std::string& s = lines[i];
    const std::size_t first = s.find_first_not_of(" \t");
    if (first != std::string::npos && s.find('\t') < first && s[first] != '#') {
      return at(origin, i) + "a tab in the indentation; YAML indents with spaces";
    }
  }
  const std::string fallback = (line >= 0 ? at(origin, line) : origin + ": ") + "malformed YAML: " + what +
                               (column >= 0 ? " (column " + std::to_string(column + 1) + ")" : "");
  if (line < 0 || line >= static_cast<int>(lines.size())) return fallback;
  if (what.find("flow") != std::string::npos) {
    const std::string unclosed = unclosedFlow(lines, line, column, origin);
    return unclosed.empty() ? fallback : unclosed;
  }
  const std::string& here = lines[line];
  const int before = previousSignificant(lines, line);
  const std::size_t indent = indentOf(here);
  if (before >= 0 && significant(here)) {
    const std::string& prev = lines[before];
    const std::size_t prev_indent = indentOf(prev);
    if (indent > prev_indent && hasInlineValue(prev)) {
      return at(origin, line) + "`" + keyText(here) + "` is indented deeper than `" + trimmed(prev) + "` (line " +
             std::to_string(before + 1) + "), which has a value already; indent it as its siblings, or move the " +
             "value to a line of its own";
    }
    if (indent == prev_indent && isListItem(here) != isListItem(prev)) {
      return at(origin, line) + "`" + trimmed(here) + "` mixes " + (isListItem(here) ? "a list item" : "a key") +
             " into the " + (isListItem(prev) ? "list" : "keys") + " above it (line " + std::to_string(before + 1) +
             "); one section holds either keys or a list";
    }
    if (indent < prev_indent && what.find("end of") != std::string::npos) {
      // Find the sibling block `here` should belong to: the nearest line above
      // with its indentation or less.
      for (int i = before; i >= 0; --i) {
        if (!significant(lines[i])) continue;
        const std::size_t k = indentOf(lines[i]);
        if (k == indent) break;  // a real sibling: not this cause
        if (k < indent) {
          return at(origin, line) + "`" + keyText(here) + "` is indented " + std::to_string(indent) +
                 (indent == 1 ? " space" : " spaces") + ", between its section `" + keyText(lines[i]) + "` (" + std::to_string(k) +
                 ") and the keys under it (" + std::to_string(prev_indent) + "); line it up with one of them";
        }
      }
    }
  }
  if (mapColons(trimmed(here)).size() > 1 && what.find("map value") != std::string::npos) {
    return at(origin, line) + "a second ': ' in `" + trimmed(here) + "`; quote a value that contains ': '";
  }
  return fallback;
}

}  // namespace pipeforge
