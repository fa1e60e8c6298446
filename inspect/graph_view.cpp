#include "inspect/graph_view.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/script.h>
#ifdef PIPEFORGE_WITH_GRAPHVIZ
#include <graphviz/gvc.h>
#endif
#include <nlohmann/json.hpp>

#include <memory>
#include <sstream>

#include "common/error.h"
#include "frontend/model_dag.h"
#include "frontend/opened_model.h"

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

std::string escapeDot(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

std::string crossLabel(const PipeView& view, const stage::ValueSource& src) {
  if (src.kind == stage::ValueSource::Kind::kInput) return view.manifest.inputs.at(src.index);
  const auto& meta = view.manifest.stages.at(src.stage).output_meta;
  std::string label = fmt::format("out {}", src.index);
  if (src.index < static_cast<int>(meta.size())) label += "\\n" + meta[src.index];
  return label;
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
  j["cross_stage_edges"] = json::array();
  for (const auto& s : view.manifest.stages) {
    for (size_t i = 0; i < s.inputs.size(); ++i) {
      const auto& src = s.inputs[i];
      if (src.kind != stage::ValueSource::Kind::kStage) continue;
      if (!shown(only_stage, s.index) && !shown(only_stage, src.stage)) continue;
      json e{{"from_stage", src.stage}, {"output", src.index}, {"to_stage", s.index}, {"input", i}};
      const auto& meta = view.manifest.stages[src.stage].output_meta;
      if (src.index < static_cast<int>(meta.size())) e["meta"] = meta[src.index];
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
  out << "  model_inputs [label=\"inputs\\n" << escapeDot(fmt::format("{}", fmt::join(view.manifest.inputs, ", ")))
      << "\", shape=oval, fillcolor=white];\n";
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
  // Cross-stage edges: stage outputs to the inputs of the stages that read them.
  for (const auto& s : view.manifest.stages) {
    if (!shown(only_stage, s.index)) continue;
    size_t in_vertex = 0;
    for (const auto& src : s.inputs) {
      std::string from = src.kind == stage::ValueSource::Kind::kInput
                             ? "model_inputs"
                             : fmt::format("s{}_n{}", src.stage, boost::num_vertices(dags[src.stage].graph) - 1);
      if (src.kind == stage::ValueSource::Kind::kStage && !shown(only_stage, src.stage)) from = fmt::format("stage_{}_out", src.stage);
      out << "  " << from << " -> s" << s.index << "_n" << in_vertex << " [label=\"" << crossLabel(view, src)
          << "\", color=\"#d62728\", penwidth=1.5];\n";
    }
  }
  for (const auto& o : view.manifest.outputs) {
    if (o.kind != stage::ValueSource::Kind::kStage || !shown(only_stage, o.stage)) continue;
    out << "  s" << o.stage << "_n" << boost::num_vertices(dags[o.stage].graph) - 1 << " -> model_outputs [label=\""
        << crossLabel(view, o) << "\"];\n";
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
