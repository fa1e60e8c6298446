// The forward graph of an opened model as a DAG (Boost.Graph).
//
// One vertex per top-level node of the opened graph that does work: an op, a
// submodule call, a whole control-flow construct (prim::If / prim::Loop keep
// their bodies inside one vertex), or a pipe_split marker; plus one vertex for
// the model inputs and one for its outputs. Constants and prim::GetAttr reads
// are not vertices: they are free to repeat in whichever stage needs them.
// Vertex ids follow graph order, which is a topological order.
#pragma once

#include <boost/graph/adjacency_list.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace torch::jit {
struct Node;
}

namespace pipeforge::frontend {

class OpenedModel;

enum class DagNodeKind { kInputs, kOutputs, kOp, kCall, kControlFlow, kMarker };

struct DagValue {
  std::string name;                // the graph's debug name, e.g. "x.5"
  std::string type;                // TorchScript type, e.g. "Tensor", "int"
  bool is_tensor = false;
  std::vector<int64_t> shape;      // filled by shape propagation when known
  std::string dtype;               // idem
};

struct DagNode {
  DagNodeKind kind = DagNodeKind::kOp;
  std::string op;                  // "aten::add", "prim::CallMethod", ...
  std::string owner;               // FQN of the module whose code holds the node
  std::string callee;              // for kCall: FQN of the called module
  std::string source;              // "file:line" when recorded
  std::vector<DagValue> outputs;
  std::vector<std::string> parameters;  // FQNs of parameters/buffers the node reads
  torch::jit::Node* node = nullptr;     // the node in OpenedModel::graph()
};

struct DagEdge {
  std::string value;               // name of the value flowing along the edge
  int output_index = 0;            // which output of the source vertex
};

using DagGraph = boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS, DagNode, DagEdge>;

struct ModelDag {
  DagGraph graph;
  std::vector<std::string> input_names;          // forward's arguments, `self` excluded
  std::map<std::string, int64_t> tensor_bytes;   // parameter/buffer FQN -> bytes
  std::vector<std::vector<std::string>> aliases; // FQN groups naming one tensor (tied weights)
  // forward returns a tuple built at its end: the outputs vertex then reads
  // the tuple's elements, and the model has one output per element.
  bool returns_tuple = false;
};

ModelDag buildDag(const OpenedModel& model);

}  // namespace pipeforge::frontend
