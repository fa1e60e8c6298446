// Small TorchScript modules written as source text in a test, for
// source-in / expectation-out cases that need no zoo file.
#pragma once

#include <torch/script.h>

#include <string>
#include <utility>
#include <vector>

namespace pipeforge::testing {

// A module of class `name` whose methods are `source` (TorchScript), with
// the given submodules and parameters registered before the code is compiled.
// Code compiled here sees submodules as plain objects: call one as
// `self.sub.forward(x)`, which is the prim::CallMethod that `self.sub(x)`
// becomes in a model scripted from Python.
inline torch::jit::Module scriptModule(const std::string& name, const std::string& source,
                                       const std::vector<std::pair<std::string, torch::jit::Module>>& children = {},
                                       const std::vector<std::pair<std::string, at::Tensor>>& parameters = {}) {
  torch::jit::Module m(name);
  for (const auto& [child_name, child] : children) m.register_module(child_name, child);
  for (const auto& [param_name, value] : parameters) m.register_parameter(param_name, value, false);
  m.define(source);
  return m;
}

// Linear-like leaf: forward(x) = x @ weight + bias.
inline torch::jit::Module affine(const std::string& name, int64_t n) {
  return scriptModule(name, "def forward(self, x):\n    return x @ self.weight + self.bias\n", {},
                      {{"weight", torch::eye(n)}, {"bias", torch::zeros({n})}});
}

// A bias-free leaf of class "Lin_<name>": forward(x) = x @ ones(4, 4).
inline torch::jit::Module linear4(const std::string& name) {
  return scriptModule("Lin_" + name, "def forward(self, x):\n    return torch.mm(x, self.weight)\n", {},
                      {{"weight", torch::ones({4, 4})}});
}

}  // namespace pipeforge::testing
