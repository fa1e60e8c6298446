// Module FQNs: reading them off a graph, and suggesting near matches.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torch::jit {
struct Module;
struct Value;
}  // namespace torch::jit

namespace pipeforge::frontend {

// The FQN a value stands for when it is reached from the graph's `self` by a
// chain of prim::GetAttr ("" for self, "layers.1.lin", "layers.1.lin.weight");
// nullopt for any other value.
std::optional<std::string> attributePath(const torch::jit::Value* value);

// True when `fqn` is `ancestor` or lies inside it: "layers.1.lin" is within
// "layers.1" and within "" (the root), not within "layers.10".
bool isWithin(const std::string& fqn, const std::string& ancestor);

// "a.b" + "c" -> "a.b.c"; "" + "c" -> "c".
std::string joinPath(const std::string& prefix, const std::string& name);

// The reverse: "a.b.c" -> {"a.b", "c"}; "c" -> {"", "c"}.
std::pair<std::string, std::string> splitPath(const std::string& fqn);

// The submodule of `root` at `fqn` ("" for `root` itself).
torch::jit::Module submoduleAt(const torch::jit::Module& root, const std::string& fqn);

// Every submodule FQN of `module` ("" excluded), in definition order.
std::vector<std::string> submodulePaths(const torch::jit::Module& module);

// Up to `limit` candidates closest to `wanted` by edit distance, closest first.
std::vector<std::string> nearestNames(const std::string& wanted, const std::vector<std::string>& candidates,
                                      size_t limit = 3);

}  // namespace pipeforge::frontend
