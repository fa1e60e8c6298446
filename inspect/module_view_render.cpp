#include "inspect/module_view_render.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <sstream>

#include "inspect/dot_text.h"
#include "inspect/pipe_values.h"
#include "stage/value_meta.h"

namespace pipeforge::inspect {
namespace {

using stage::ValueSource;

// A value named by the module that made it: "transformer.h.0", or
// "transformer.wpe:1" for output 1 of a node with several; inputs by name.
std::string moduleValueName(const ModuleView& view, const ValueSource& v) {
  if (v.kind == ValueSource::Kind::kInput) return view.manifest.inputs.at(v.index);
  const ModuleNode& node = view.nodes.at(v.stage);
  const std::string base = node.module.empty() ? fmt::format("node {}", v.stage) : node.module;
  if (view.manifest.stages.at(v.stage).num_outputs == 1) return base;
  return fmt::format("{}:{}", base, v.index);
}

std::string meta(const ModuleView& view, const ValueSource& v) {
  auto parsed = stage::parseValueMeta(recordedMeta(view.manifest, v));
  return parsed ? stage::formatValueMeta(*parsed) : "";
}

// "input_ids: int64[2, 16] (256 B)", or the bare name without meta.
std::string described(const ModuleView& view, const ValueSource& v) {
  const std::string text = describeValue(view.manifest, v);
  return moduleValueName(view, v) + (text.empty() ? "" : ": " + text);
}

bool anyMeta(const ModuleView& view) {
  if (!view.manifest.input_meta.empty()) return true;
  return std::any_of(view.manifest.stages.begin(), view.manifest.stages.end(),
                     [](const stage::StageInfo& s) { return !s.output_meta.empty(); });
}

}  // namespace

std::string moduleViewText(const ModuleView& view) {
  const auto& m = view.manifest;
  std::ostringstream out;
  out << fmt::format("module view of {} at depth {}: {} nodes, one per module call (ops between calls join the "
                     "call before them)\n",
                     view.source, view.depth, view.nodes.size());
  if (view.spec_cuts_ignored) out << "(the spec's split points and policy are not drawn here; only its inputs are)\n";
  std::vector<std::string> inputs;
  for (size_t i = 0; i < m.inputs.size(); ++i) {
    inputs.push_back(described(view, {ValueSource::Kind::kInput, -1, static_cast<int>(i)}));
  }
  out << "inputs: " << fmt::format("{}", fmt::join(inputs, ", ")) << "\n";
  size_t width = 6;
  for (const auto& n : view.nodes) width = std::max(width, n.module.size());
  out << fmt::format("  {:>4}  {:<{}}  {:<20}  {:>14}  {:>4}\n", "node", "module", width, "class", "params+buffers", "ops");
  for (size_t k = 0; k < view.nodes.size(); ++k) {
    const ModuleNode& n = view.nodes[k];
    out << fmt::format("  {:>4}  {:<{}}  {:<20}  {:>14}  {:>4}\n", k, n.module.empty() ? "-" : n.module, width,
                       n.class_name.empty() ? "-" : n.class_name, fmt::format("{} B", n.state_bytes), n.ops);
  }
  out << (anyMeta(view) ? "values crossing each cut (dtype and shape from example_inputs):\n"
                        : "values crossing each cut (no shapes: give --spec a split spec with example_inputs):\n");
  for (int after = 0; after + 1 < m.num_stages; ++after) {
    for (const CrossingValue& c : valuesCrossing(m, after)) {
      const std::string to = c.to == m.num_stages ? "output" : fmt::format("node {}", c.to);
      out << fmt::format("  {}|{}  {}  (made by node {}, last read by {})\n", after, after + 1, described(view, c.value), c.value.stage,
                         to);
    }
    if (auto total = bytesCrossing(m, after)) out << fmt::format("  {}|{}  total {} B\n", after, after + 1, *total);
  }
  std::vector<std::string> outputs;
  for (const auto& o : m.outputs) outputs.push_back(described(view, o));
  out << "outputs: " << fmt::format("{}", fmt::join(outputs, ", ")) << "\n";
  return out.str();
}

std::string moduleViewJson(const ModuleView& view) {
  using nlohmann::json;
  const auto& m = view.manifest;
  auto value = [&](const ValueSource& v) {
    json j{{"value", moduleValueName(view, v)}};
    if (v.kind == ValueSource::Kind::kInput) {
      j["input"] = v.index;
    } else {
      j["node"] = v.stage;
      j["output"] = v.index;
    }
    const std::string text = meta(view, v);
    if (!text.empty()) j["meta"] = text;
    if (auto bytes = recordedBytes(m, v)) j["bytes"] = *bytes;
    return j;
  };
  json j{{"source", view.source}, {"depth", view.depth}};
  j["inputs"] = json::array();
  for (size_t i = 0; i < m.inputs.size(); ++i) j["inputs"].push_back(value({ValueSource::Kind::kInput, -1, static_cast<int>(i)}));
  j["nodes"] = json::array();
  for (size_t k = 0; k < view.nodes.size(); ++k) {
    const ModuleNode& n = view.nodes[k];
    j["nodes"].push_back({{"index", k}, {"module", n.module}, {"class", n.class_name}, {"ops", n.ops},
                          {"state_bytes", n.state_bytes}});
  }
  j["edges"] = json::array();
  for (const auto& s : m.stages) {
    for (size_t i = 0; i < s.inputs.size(); ++i) {
      json e = value(s.inputs[i]);
      e["to_node"] = s.index;
      e["to_input"] = i;
      j["edges"].push_back(e);
    }
  }
  j["cuts"] = json::array();
  for (int after = 0; after + 1 < m.num_stages; ++after) {
    json cut{{"after", after}, {"values", json::array()}};
    for (const CrossingValue& c : valuesCrossing(m, after)) {
      json v = value(c.value);
      v["last_reader"] = c.to == m.num_stages ? json("output") : json(c.to);
      cut["values"].push_back(v);
    }
    if (auto total = bytesCrossing(m, after)) cut["bytes"] = *total;
    j["cuts"].push_back(cut);
  }
  j["outputs"] = json::array();
  for (const auto& o : m.outputs) j["outputs"].push_back(value(o));
  return j.dump(1) + "\n";
}

std::string moduleViewDot(const ModuleView& view) {
  const auto& m = view.manifest;
  std::ostringstream out;
  out << "digraph modules {\n  rankdir=TB;\n  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\", "
         "fontsize=10, fillcolor=\"#a6cee3\"];\n  edge [color=\"#555555\"];\n";
  auto label = [&](const ValueSource& v) { return valueNodeLabel(moduleValueName(view, v), m, v); };
  for (size_t i = 0; i < m.inputs.size(); ++i) {
    const ValueSource v{ValueSource::Kind::kInput, -1, static_cast<int>(i)};
    out << "  " << valueNodeId(v) << " [label=\"" << label(v) << "\", shape=oval, fillcolor=white];\n";
  }
  for (size_t k = 0; k < view.nodes.size(); ++k) {
    const ModuleNode& n = view.nodes[k];
    std::string text = escapeDot(n.module.empty() ? fmt::format("node {}", k) : n.module);
    if (!n.class_name.empty()) text += "\\n" + escapeDot(n.class_name);
    text += fmt::format("\\n{} B params+buffers, {} ops", n.state_bytes, n.ops);
    out << "  node_" << k << " [label=\"" << text << "\"];\n";
  }
  out << "  model_outputs [label=\"outputs\", shape=oval, fillcolor=white];\n";
  for (const auto& v : stageOutputsRead(m)) {
    out << "  " << valueNodeId(v) << " [label=\"" << label(v) << "\", fillcolor=white, color=\"#d62728\"];\n";
    out << "  node_" << v.stage << " -> " << valueNodeId(v) << ";\n";
  }
  for (const auto& s : m.stages) {
    for (const auto& in : s.inputs) out << "  " << valueNodeId(in) << " -> node_" << s.index << ";\n";
  }
  for (const auto& o : m.outputs) out << "  " << valueNodeId(o) << " -> model_outputs;\n";
  out << "}\n";
  return out.str();
}

}  // namespace pipeforge::inspect
