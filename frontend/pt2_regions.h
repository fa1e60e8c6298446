// Grouping an exported graph's nodes into the module calls they ran in
// (Note [PT2 as nested TorchScript]): which run of nodes becomes which
// module's method, what each method takes and returns, and where functional
// buffer updates are written back. A pure analysis of the graph JSON; the
// importer emits TorchScript from its result.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <climits>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "frontend/pt2_archive.h"
#include "frontend/pt2_graph_values.h"

namespace pipeforge::frontend {

// One maximal run of nodes inside one module call.
struct Pt2Region {
  struct Item {
    bool is_region = false;
    int index = 0;  // a node position, or a region index when is_region
  };
  std::string path;  // FQN of the called module
  std::string key;   // "<nn_module_stack key>|<path>": one call
  std::string type;  // the module's Python class
  int parent = -1;
  std::vector<Item> items;  // nodes and nested calls, in graph order
  int first = INT_MAX;      // first and last node position inside the call
  int last = -1;
  std::vector<std::string> inputs;   // values the call reads from outside
  std::vector<std::string> outputs;  // values it makes that are read after it
};

// A functional buffer update (Note [PT2 as nested TorchScript]): `value` is
// copied into the buffer read through the placeholder `buffer`.
struct Pt2WriteBack {
  std::string value;
  std::string buffer;
};

struct Pt2Regions {
  std::vector<Pt2Region> regions;                      // [0] is forward itself
  std::vector<int> region_of_pos;                      // node position -> innermost region holding it
  std::unordered_map<std::string, int> def_pos;        // value -> position of the node that makes it
  std::map<int, std::vector<Pt2WriteBack>> writes;     // node position -> updates written back after it
};

// Groups the top-level `nodes` of `graph` (a Graph object, nodes 1:1 with
// `nodes`) by their module stacks. Throws Pt2Error when a mutation output is
// not computed or names no graph input.
Pt2Regions groupPt2Regions(const nlohmann::ordered_json& graph, const std::vector<Pt2Node>& nodes,
                           const Pt2GraphValues& values);

// Whether `value` is a symbolic size that calls recompute rather than return
// (Note [Symbolic sizes are recomputed, not returned]).
bool isPt2FloatingSize(const nlohmann::ordered_json& graph, const std::unordered_map<std::string, int>& def_pos,
                       const std::string& value);

}  // namespace pipeforge::frontend
