#include "frontend/model_dag.h"

#include <torch/csrc/jit/ir/ir.h>
#include <torch/script.h>

#include <unordered_map>
#include <unordered_set>

#include "frontend/graph_reads.h"
#include "frontend/module_paths.h"
#include "frontend/opened_model.h"

namespace pipeforge::frontend {
namespace {

using torch::jit::Block;
using torch::jit::Node;
using torch::jit::Value;

DagNodeKind kindOf(const Node* n) {
  if (isPipeSplitMarker(n)) return DagNodeKind::kMarker;
  if (n->kind() == c10::prim::CallMethod) return DagNodeKind::kCall;
  if (!n->blocks().empty()) return DagNodeKind::kControlFlow;
  return DagNodeKind::kOp;
}

// FQNs of the parameters/buffers a node reads, also from inside its blocks:
// tensors reached by GetAttr, and every tensor of a module it calls.
void parametersRead(const Node* n, const std::set<std::string>& tensor_names, std::set<std::string>& names) {
  for (const Value* v : n->inputs()) {
    auto path = attributePath(v);
    if (!path) continue;
    if (tensor_names.count(*path)) names.insert(*path);
    if (n->kind() != c10::prim::GetAttr && v->type()->cast<c10::ClassType>() && !path->empty()) {
      for (auto it = tensor_names.lower_bound(*path + "."); it != tensor_names.end() && it->compare(0, path->size() + 1, *path + ".") == 0; ++it) {
        names.insert(*it);
      }
    }
  }
  for (const Block* b : n->blocks()) {
    for (const Node* inner : b->nodes()) parametersRead(inner, tensor_names, names);
  }
}

}  // namespace

ModelDag buildDag(const OpenedModel& model) {
  ModelDag dag;
  torch::jit::Graph& graph = model.graph();
  const torch::jit::Module& root = model.module();

  std::set<std::string> tensor_names;
  for (const auto& p : root.named_parameters(true)) tensor_names.insert(p.name);
  for (const auto& b : root.named_buffers(true)) tensor_names.insert(b.name);
  for (const auto& p : root.named_parameters(true)) dag.tensor_bytes[p.name] = p.value.numel() * p.value.element_size();
  for (const auto& b : root.named_buffers(true)) dag.tensor_bytes[b.name] = b.value.numel() * b.value.element_size();
  {
    // Group names by the storage they share: that is what "tied" means.
    std::map<const void*, std::vector<std::string>> by_storage;
    for (const auto& p : root.named_parameters(true)) by_storage[p.value.unsafeGetTensorImpl()].push_back(p.name);
    for (const auto& [impl, names] : by_storage) {
      if (names.size() > 1) dag.aliases.push_back(names);
    }
    std::sort(dag.aliases.begin(), dag.aliases.end());
  }

  std::unordered_map<const Value*, std::pair<size_t, int>> producer;  // value -> (vertex, output index)
  auto input_vertex = boost::add_vertex(dag.graph);
  dag.graph[input_vertex].kind = DagNodeKind::kInputs;
  dag.graph[input_vertex].op = "inputs";
  const auto& schema_args = root.get_method("forward").function().getSchema().arguments();
  for (size_t i = 1; i < graph.inputs().size(); ++i) {
    const Value* v = graph.inputs()[i];
    dag.input_names.push_back(i < schema_args.size() ? schema_args[i].name() : v->debugName());
    dag.graph[input_vertex].outputs.push_back({v->debugName(), v->type()->repr_str(),
                                                v->type()->cast<c10::TensorType>() != nullptr, {}, ""});
    producer[v] = {input_vertex, static_cast<int>(i - 1)};
  }

  auto connect = [&](size_t to, const std::vector<const Value*>& inputs) {
    std::set<std::pair<size_t, int>> done;
    for (const Value* v : inputs) {
      auto it = producer.find(v);
      if (it == producer.end() || !done.insert(it->second).second) continue;
      DagEdge e;
      e.value = v->debugName();
      e.output_index = it->second.second;
      boost::add_edge(it->second.first, to, e, dag.graph);
    }
  };

  // A tuple built only to be returned is the model's output list, not work.
  Node* return_tuple = nullptr;
  if (graph.outputs().size() == 1) {
    Node* producer_node = graph.outputs()[0]->node();
    if (producer_node->kind() == c10::prim::TupleConstruct && graph.outputs()[0]->uses().size() == 1) {
      return_tuple = producer_node;
      dag.returns_tuple = true;
    }
  }

  for (Node* n : graph.nodes()) {
    if (isFreeNode(n) || n == return_tuple) continue;
    auto read = externalInputs(n);
    std::vector<const Value*> inputs(read.begin(), read.end());
    auto vertex = boost::add_vertex(dag.graph);
    DagNode& d = dag.graph[vertex];
    d.kind = kindOf(n);
    d.op = n->kind().toQualString();
    d.owner = model.ownerOf(n);
    if (d.kind == DagNodeKind::kCall) {
      d.callee = attributePath(n->input(0)).value_or("");
      d.op = "call " + d.callee + "." + n->s(c10::attr::name);
    }
    d.source = sourceLocation(n);
    d.node = n;
    std::set<std::string> tensors_read;
    parametersRead(n, tensor_names, tensors_read);
    d.parameters.assign(tensors_read.begin(), tensors_read.end());
    for (size_t i = 0; i < n->outputs().size(); ++i) {
      const Value* v = n->outputs()[i];
      d.outputs.push_back({v->debugName(), v->type()->repr_str(), v->type()->cast<c10::TensorType>() != nullptr, {}, ""});
      producer[v] = {vertex, static_cast<int>(i)};
    }
    connect(vertex, inputs);
  }

  auto output_vertex = boost::add_vertex(dag.graph);
  dag.graph[output_vertex].kind = DagNodeKind::kOutputs;
  dag.graph[output_vertex].op = "outputs";
  std::vector<const Value*> outs;
  if (return_tuple) {
    outs.assign(return_tuple->inputs().begin(), return_tuple->inputs().end());
  } else {
    outs.assign(graph.outputs().begin(), graph.outputs().end());
  }
  connect(output_vertex, outs);
  return dag;
}

}  // namespace pipeforge::frontend
