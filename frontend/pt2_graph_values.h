// What an exported program's graph signature says each graph value is: a
// user input or output, a lifted parameter, buffer or constant (and the FQN
// of its tensor), or a functional update of one; and which FQNs name one
// tensor. Read once by the importer; region grouping and emission consult it.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace pipeforge::frontend {

struct Pt2Signature;

struct Pt2GraphValues {
  std::vector<std::string> user_inputs;
  std::vector<std::string> user_outputs;
  std::unordered_map<std::string, std::string> placeholder_fqn;  // lifted placeholder -> FQN of its tensor
  std::unordered_map<std::string, std::string> fqn_placeholder;  // FQN -> its placeholder
  std::map<std::string, std::string> mutations;                  // graph value -> buffer/parameter FQN it becomes
  std::map<std::string, std::vector<std::string>> aliases;       // FQN -> every FQN of the same tensor, itself too;
                                                                 // filled by whoever holds the tensors
};

// The values of `signature`. `require_tensor` is called with the FQN of each
// lifted input, in order, and throws when the archive lacks its payload.
// Throws Pt2Error, naming `source` (the archive's path) first, for what a
// stage cannot run: non-tensor inputs or outputs, script objects, effect
// tokens, joint forward-backward graphs, in-place updates of inputs.
Pt2GraphValues readPt2GraphValues(const Pt2Signature& signature, const std::string& source,
                                  const std::function<void(const std::string& fqn)>& require_tensor);

// An FQN naming `fqn`'s tensor that lies inside module `path` (`fqn` itself
// first, then its tied aliases); nullopt when none does.
std::optional<std::string> reachableAlias(const Pt2GraphValues& values, const std::string& fqn,
                                          const std::string& path);

}  // namespace pipeforge::frontend
