// The call targets of an exported graph's nodes ("torch.ops.aten.add.Tensor",
// "_operator.mul"): what each names, and the check that this LibTorch has
// every operator a graph calls (Note [Python-only custom ops]).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>

namespace pipeforge::frontend {

inline constexpr const char* kPt2HigherOrderPrefix = "torch.ops.higher_order.";

// A dispatcher operator named by a target: {aten, add, Tensor}.
struct Pt2OpName {
  std::string ns, name, overload;
  std::string qualified() const { return ns + "::" + name; }          // "aten::add"
  std::string display() const { return qualified() + "." + overload; }  // "aten::add.Tensor"
};

// "torch.ops.aten.add.Tensor" -> {aten, add, Tensor}; nullopt for a target
// that is not "torch.ops.<ns>.<name>.<overload>".
std::optional<Pt2OpName> parsePt2OpTarget(const std::string& target);

// pippy's and Pipeforge's pipe_split markers.
bool isPt2MarkerTarget(const std::string& target);

// "torch.ops.higher_order.cond" and the like.
bool isPt2HigherOrderTarget(const std::string& target);

// Python's symbolic-shape helpers in export graphs ("_operator.mul",
// "torch.sym_max"), each with the TorchScript builtin that computes it.
const std::map<std::string, std::string>& pt2SymbolicOps();

// Every operator that `graph` (a Graph object; cond and loop subgraphs
// included) calls and `exists` does not know, as "aten::foo.Tensor".
// Markers and higher-order ops are not operators.
std::set<std::string> missingPt2Operators(const nlohmann::ordered_json& graph,
                                          const std::function<bool(const Pt2OpName&)>& exists);

// The refusal for a non-empty `missing`: custom ops defined only in Python
// first, with the export-side fix where one is known; else the ATen ops a
// newer torch added. `torch_version` is the LibTorch pipeforge links.
std::string missingOperatorsMessage(const std::set<std::string>& missing, const std::string& torch_version);

}  // namespace pipeforge::frontend
