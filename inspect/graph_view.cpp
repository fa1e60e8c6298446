#include "inspect/graph_view.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/script.h>
#ifdef PIPEFORGE_WITH_GRAPHVIZ
#include <graphviz/gvc.h>
#endif
#include <nlohmann/json.hpp>

#include <algorithm>
#include <memory>
#include <sstream>

#include "common/error.h"
#include "frontend/model_dag.h"
#include "frontend/opened_model.h"
#include "inspect/dot_text.h"
#include "inspect/pipe_values.h"
#include "stage/value_meta.h"

namespace pipeforge::inspect {
namespace {

using frontend::DagNodeKind;

const char* kindName(DagNodeKind kind) {
  switch (kind) {
    case DagNodeKind::kInputs: return "inputs";
    case DagNodeKind::kOutputs: return "outputs";
    case DagNodeKind::kOp: return "op";
    case DagNodeKind::kCall: return "call";
    case DagNodeKind::kControlFlow: return "control_flow";
    case DagNodeKind::kMarker: return "marker";
  }
  return "?";
}

// A qualitative palette; stages cycle through it.
const char* stageColor(int stage) {
  static const char* kColors[] = {"#a6cee3", "#b2df8a", "#fdbf6f", "#cab2d6", "#fb9a99", "#ffff99", "#8dd3c7", "#d9d9d9"};
  return kColors[stage % 8];
}

std::vector<frontend::ModelDag> stageDags(const PipeView& view) {
  std::vector<frontend::ModelDag> dags;
  for (const auto& module : view.stages) {
    frontend::OpenedModel opened(module, {});
    dags.push_back(frontend::buildDag(opened));
  }
  return dags;
}

bool shown(std::optional<int> only, int stage) { return !only || *only == stage; }

// "meta" and "bytes" of a value in the JSON view, when the split recorded them.
void addMeta(nlohmann::json& j, const PipeView& view, const stage::ValueSource& v) {
  auto meta = stage::parseValueMeta(recordedMeta(view.manifest, v));
  if (!meta) return;
  j["meta"] = stage::formatValueMeta(*meta);
  if (auto bytes = recordedBytes(view.manifest, v)) j["bytes"] = *bytes;
}

}  // namespace

std::string pipeJson(const PipeView& view, std::optional<int> only_stage) {
  using nlohmann::json;
  json j;
  j["manifest"] = json::parse(stage::manifestToJson(view.manifest));
  j["stages"] = json::array();
  auto dags = stageDags(view);
  for (size_t k = 0; k < dags.size(); ++k) {
    if (!shown(only_stage, static_cast<int>(k))) continue;
    const auto& g = dags[k].graph;
    json stage{{"index", k}, {"nodes", json::array()}, {"edges", json::array()}};
    for (auto v : boost::make_iterator_range(boost::vertices(g))) {
      const auto& d = g[v];
      json outputs = json::array();
      for (const auto& o : d.outputs) outputs.push_back({{"name", o.name}, {"type", o.type}});
      stage["nodes"].push_back({{"id", v}, {"kind", kindName(d.kind)}, {"op", d.op}, {"owner", d.owner},
                                {"callee", d.callee}, {"source", d.source}, {"outputs", outputs},
                                {"parameters", d.parameters}});
    }
    for (auto e : boost::make_iterator_range(boost::edges(g))) {
      stage["edges"].push_back({{"from", boost::source(e, g)}, {"to", boost::target(e, g)}, {"value", g[e].value}});
    }
    j["stages"].push_back(stage);
  }
  j["model_inputs"] = json::array();
  for (size_t i = 0; i < view.manifest.inputs.size(); ++i) {
    const stage::ValueSource input{stage::ValueSource::Kind::kInput, -1, static_cast<int>(i)};
    json in{{"name", view.manifest.inputs[i]}};
    addMeta(in, view, input);
    j["model_inputs"].push_back(in);
  }
  j["cross_stage_edges"] = json::array();
  for (const auto& s : view.manifest.stages) {
    for (size_t i = 0; i < s.inputs.size(); ++i) {
      const auto& src = s.inputs[i];
      if (src.kind != stage::ValueSource::Kind::kStage) continue;
      if (!shown(only_stage, s.index) && !shown(only_stage, src.stage)) continue;
      json e{{"from_stage", src.stage}, {"output", src.index}, {"to_stage", s.index}, {"input", i},
             {"value", valueName(view.manifest, src)}};
      addMeta(e, view, src);
      j["cross_stage_edges"].push_back(e);
    }
  }
  return j.dump(1) + "\n";
}

std::string pipeDot(const PipeView& view, std::optional<int> only_stage) {
  std::ostringstream out;
  out << "digraph pipe {\n  rankdir=TB;\n  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\", fontsize=10];\n"
      << "  edge [fontname=\"Helvetica\", fontsize=9];\n";
  auto dags = stageDags(view);
  // Note [Values as nodes]: every model input and every value that crosses a
  // stage boundary is a node of its own, labelled with its name, dtype, shape
  // and bytes. Edge labels would be placed by dot beside their edges, where
  // parallel edges (three inputs into stage 0) put them side by side and they
  // read as one word ("ymask"); dot never lets nodes overlap.
  for (size_t i = 0; i < view.manifest.inputs.size(); ++i) {
    const stage::ValueSource input{stage::ValueSource::Kind::kInput, -1, static_cast<int>(i)};
    out << "  " << valueNodeId(input) << " [label=\"" << valueNodeLabel(valueName(view.manifest, input), view.manifest, input)
        << "\", shape=oval, fillcolor=white];\n";
  }
  out << "  model_outputs [label=\"outputs\", shape=oval, fillcolor=white];\n";
  for (size_t k = 0; k < dags.size(); ++k) {
    if (!shown(only_stage, static_cast<int>(k))) continue;
    const auto& g = dags[k].graph;
    out << "  subgraph cluster_stage_" << k << " {\n    label=\"stage " << k << "\";\n    style=filled; color=\"#eeeeee\";\n"
        << "    node [fillcolor=\"" << stageColor(static_cast<int>(k)) << "\"];\n";
    for (auto v : boost::make_iterator_range(boost::vertices(g))) {
      const auto& d = g[v];
      std::string label = d.kind == DagNodeKind::kInputs ? "stage inputs" : d.kind == DagNodeKind::kOutputs ? "stage outputs" : d.op;
      if (!d.owner.empty()) label += "\\n(" + d.owner + ")";
      out << "    s" << k << "_n" << v << " [label=\"" << escapeDot(label) << "\""
          << (d.kind == DagNodeKind::kInputs || d.kind == DagNodeKind::kOutputs ? ", shape=oval" : "") << "];\n";
    }
    for (auto e : boost::make_iterator_range(boost::edges(g))) {
      out << "    s" << k << "_n" << boost::source(e, g) << " -> s" << k << "_n" << boost::target(e, g) << ";\n";
    }
    out << "  }\n";
  }
  // Values between stages: producer -> value node -> every stage that reads it.
  auto outputsVertex = [&](int stage) {
    return shown(only_stage, stage) ? fmt::format("s{}_n{}", stage, boost::num_vertices(dags[stage].graph) - 1)
                                    : fmt::format("stage_{}_out", stage);
  };
  for (const auto& v : stageOutputsRead(view.manifest)) {
    bool read_by_shown = false;
    for (const auto& s : view.manifest.stages) {
      for (const auto& in : s.inputs) read_by_shown = read_by_shown || (in == v && shown(only_stage, s.index));
    }
    if (!shown(only_stage, v.stage) && !read_by_shown) continue;
    out << "  " << valueNodeId(v) << " [label=\"" << valueNodeLabel(valueName(view.manifest, v), view.manifest, v)
        << "\", shape=box, style=\"rounded,filled\", fillcolor=white, color=\"#d62728\"];\n";
    out << "  " << outputsVertex(v.stage) << " -> " << valueNodeId(v) << " [color=\"#d62728\", penwidth=1.5];\n";
  }
  for (const auto& s : view.manifest.stages) {
    if (!shown(only_stage, s.index)) continue;
    for (const auto& src : s.inputs) {
      out << "  " << valueNodeId(src) << " -> s" << s.index << "_n0 [color=\"#d62728\", penwidth=1.5];\n";
    }
  }
  for (const auto& o : view.manifest.outputs) {
    if (o.kind == stage::ValueSource::Kind::kStage && !shown(only_stage, o.stage)) continue;
    out << "  " << valueNodeId(o) << " -> model_outputs;\n";
  }
  out << "}\n";
  return out.str();
}

std::string renderSvg(const std::string& dot) {
#ifndef PIPEFORGE_WITH_GRAPHVIZ
  (void)dot;
  throw Error(ErrorCode::kUserInput, "this pipeforge was built without Graphviz (PIPEFORGE_WITH_GRAPHVIZ=OFF); use "
                                     "--format dot and render it with `dot -Tsvg`");
#else
  std::unique_ptr<GVC_t, int (*)(GVC_t*)> gvc(gvContext(), gvFreeContext);
  Agraph_t* graph = agmemread(dot.c_str());
  PIPEFORGE_CHECK(graph != nullptr, "graphviz could not parse the generated DOT");
  std::unique_ptr<Agraph_t, int (*)(Agraph_t*)> owned(graph, agclose);
  const int layout = gvLayout(gvc.get(), graph, "dot");
  PIPEFORGE_CHECK(layout == 0, "graphviz layout failed");
  char* data = nullptr;
  unsigned int length = 0;
  int rc = gvRenderData(gvc.get(), graph, "svg", &data, &length);
  std::string svg = rc == 0 && data ? std::string(data, length) : std::string();
  gvFreeRenderData(data);
  gvFreeLayout(gvc.get(), graph);
  PIPEFORGE_CHECK(!svg.empty(), "graphviz could not render SVG");
  return svg;
#endif
}

}  // namespace pipeforge::inspect
