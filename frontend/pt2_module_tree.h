// The module tree an exported program is rebuilt into (Note [PT2 as nested
// TorchScript] in pt2_import.cpp): one TorchScript module per FQN, under its
// original name and class, holding the archive's parameters and buffers.
// The importer adds methods to it as it writes them.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace c10 {
struct ClassType;
}  // namespace c10

namespace torch::jit {
struct Graph;
struct Module;
}  // namespace torch::jit

namespace pipeforge::frontend {

class Pt2Archive;

class Pt2ModuleTree {
 public:
  // A module for every FQN the archive names (module call graph, module
  // stacks, tensor owners), each tensor registered on its owner. Throws
  // Pt2Error when a tensor has the name of a submodule.
  explicit Pt2ModuleTree(const Pt2Archive& archive);
  ~Pt2ModuleTree();
  Pt2ModuleTree(Pt2ModuleTree&&) noexcept;
  Pt2ModuleTree& operator=(Pt2ModuleTree&&) noexcept;

  // The root module (FQN "").
  torch::jit::Module root() const;

  // The class of the module at `path`.
  std::shared_ptr<c10::ClassType> typeOf(const std::string& path) const;

  // Tied names: FQN -> every FQN holding the same tensor object (itself included).
  std::map<std::string, std::vector<std::string>> tiedNames() const;

  // Adds `graph` (its first input is `self`) as a method of the module at
  // `path`, named `base`, or `base_1`, `base_2`... for later calls with the
  // same base; returns the name.
  std::string defineMethod(const std::string& path, const std::string& base, std::shared_ptr<torch::jit::Graph> graph);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The module tree registers a value the archive still holds in a
// checkpoint's other dtype (Pt2TensorEntry::convert_to) as a meta-device
// stand-in; before the model runs, this converts each such value (once per
// tie) and sets it on `root`, the imported model.
void fillConvertedWeights(const Pt2Archive& archive, torch::jit::Module& root);

}  // namespace pipeforge::frontend
