// The label boxes of an SVG that Graphviz drew: one box per node, edge or
// cluster, around all its <text> lines, for tests that check labels do not
// overlap. Text widths are estimated as Graphviz does without font files:
// 0.6 of the font size per character, which is wider than Helvetica's average.
#pragma once

#include <algorithm>
#include <regex>
#include <string>
#include <vector>

namespace pipeforge::testing {

struct LabelBox {
  std::string title;  // the group's <title>: "in_2", "model_inputs->s0_n0"
  std::string text;   // its lines joined by '|'
  double x0 = 1e9, y0 = 1e9, x1 = -1e9, y1 = -1e9;
};

inline int svgCharacters(const std::string& text) {
  // An entity (&amp;, &#45;) is one character.
  return static_cast<int>(std::regex_replace(text, std::regex("&[#a-zA-Z0-9]+;"), "_").size());
}

inline std::vector<LabelBox> svgLabelBoxes(const std::string& svg) {
  static const std::regex group(R"re(<g id="[^"]*" class="(node|edge|cluster)">([\s\S]*?)</g>)re");
  static const std::regex title(R"re(<title>([^<]*)</title>)re");
  static const std::regex text(
      R"re(<text text-anchor="(start|middle|end)" x="([-0-9.]+)" y="([-0-9.]+)"[^>]*font-size="([0-9.]+)"[^>]*>([^<]*)</text>)re");
  std::vector<LabelBox> boxes;
  for (auto g = std::sregex_iterator(svg.begin(), svg.end(), group); g != std::sregex_iterator(); ++g) {
    const std::string body = (*g)[2];
    LabelBox box;
    std::smatch t;
    if (std::regex_search(body, t, title)) box.title = t[1];
    bool any = false;
    for (auto l = std::sregex_iterator(body.begin(), body.end(), text); l != std::sregex_iterator(); ++l) {
      const std::string anchor = (*l)[1];
      const double x = std::stod((*l)[2]), y = std::stod((*l)[3]), size = std::stod((*l)[4]);
      const double width = 0.6 * size * svgCharacters((*l)[5]);
      const double left = anchor == "start" ? x : anchor == "middle" ? x - width / 2 : x - width;
      box.x0 = std::min(box.x0, left);
      box.x1 = std::max(box.x1, left + width);
      box.y0 = std::min(box.y0, y - 0.8 * size);  // y is the baseline
      box.y1 = std::max(box.y1, y + 0.2 * size);
      box.text += (any ? "|" : "") + std::string((*l)[5]);
      any = true;
    }
    if (any) boxes.push_back(box);
  }
  return boxes;
}

// Pairs of label boxes closer than `gap` points in both directions: text
// that touches, or reads as one word ("y" and "mask" as "ymask").
inline std::vector<std::string> crowdedLabels(const std::vector<LabelBox>& boxes, double gap) {
  std::vector<std::string> crowded;
  for (size_t i = 0; i < boxes.size(); ++i) {
    for (size_t j = i + 1; j < boxes.size(); ++j) {
      const LabelBox& a = boxes[i];
      const LabelBox& b = boxes[j];
      bool apart = a.x1 + gap <= b.x0 || b.x1 + gap <= a.x0 || a.y1 + gap <= b.y0 || b.y1 + gap <= a.y0;
      if (!apart) crowded.push_back("'" + a.text + "' (" + a.title + ") and '" + b.text + "' (" + b.title + ")");
    }
  }
  return crowded;
}

}  // namespace pipeforge::testing
