// A model's forward graph with chosen submodule calls opened (inlined).
//
// Calls are opened one at a time, only as deep as a split needs: a split at
// `blocks.2.mlp` opens the call to `blocks.2` (and any call on `self`), so
// `blocks.2.mlp` becomes one call node of the opened graph. Every node the
// opening produced remembers the FQN of the module whose code it came from.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace torch::jit {
struct Graph;
struct Module;
struct Node;
}  // namespace torch::jit

namespace pipeforge::frontend {

struct OpenOptions {
  // Calls to every proper ancestor of these FQNs are opened.
  std::vector<std::string> split_fqns;
  // Additionally open calls to modules that themselves call submodules,
  // this many levels of calls deep (1: the calls forward makes itself).
  // Used by automatic policies to find enough cut points.
  int open_depth = 0;
  // Open every module call, leaf modules (a Linear) included, and every
  // function call (F.relu in a scripted model), so the graph holds only ops:
  // what tensor-parallel planning reads.
  bool open_all = false;
};

class OpenedModel {
 public:
  OpenedModel(const torch::jit::Module& module, const OpenOptions& options);
  ~OpenedModel();
  OpenedModel(OpenedModel&&) noexcept;
  OpenedModel& operator=(OpenedModel&&) noexcept;

  const torch::jit::Module& module() const;
  // The opened copy of forward's graph (the model itself is not changed).
  torch::jit::Graph& graph() const;
  // FQN of the module whose forward produced `node` ("" for the root's own code).
  const std::string& ownerOf(const torch::jit::Node* node) const;
  // True when some call could be opened further at a deeper open_depth.
  bool hasDeeperCalls() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// True for the pipe_split marker op node.
bool isPipeSplitMarker(const torch::jit::Node* node);

}  // namespace pipeforge::frontend
