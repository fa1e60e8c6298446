// Decoding a torch.export Argument (the JSON of one node input or subgraph
// output) into a TorchScript value: constants are inserted into the graph,
// names of tensors and symbolic values are resolved by the caller.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <functional>
#include <string>

namespace torch::jit {
struct Graph;
struct Value;
}  // namespace torch::jit

namespace pipeforge::frontend {

// Where Arguments are read into: the graph (constants go at its insert
// point), how an export value name becomes a value there, and the archive's
// path, which every error message names first.
struct Pt2ArgumentScope {
  torch::jit::Graph* graph = nullptr;
  std::function<torch::jit::Value*(const std::string& name)> resolve;
  std::string source;
};

// `arg` ({"as_int": 3}, {"as_tensor": {"name": "x"}}, ...) as a value of
// `scope.graph`. The schema's dtype, memory format and layout codes become
// c10's. Throws Pt2Error naming `where` (the node) for a malformed argument
// or one TorchScript cannot express.
torch::jit::Value* readPt2Argument(const Pt2ArgumentScope& scope, const nlohmann::ordered_json& arg,
                                   const std::string& where);

// A float as the schema writes it: a number, or "Infinity", "-Infinity" and
// "NaN" (also "inf", "-inf", "nan"). Throws Pt2Error for any other string.
double pt2FloatOf(const nlohmann::ordered_json& value);

}  // namespace pipeforge::frontend
