// Access to the generated test model zoo (tests/models/generate_zoo.py).
#pragma once

#include <torch/script.h>

#include <string>
#include <vector>

namespace pipeforge::testing {

// Absolute path of zoo model `name` (e.g. "gpt" -> <build>/zoo/gpt.pt).
std::string zooModelPath(const std::string& name);

struct Reference {
  std::vector<torch::jit::IValue> inputs;
  std::vector<at::Tensor> outputs;
};

// The fixed inputs and reference outputs saved beside model `name`.
Reference loadReference(const std::string& name);

// Runs `forward` and returns its result as a flat list of tensors (a tuple is unpacked).
std::vector<at::Tensor> runForward(torch::jit::Module& module, const std::vector<torch::jit::IValue>& inputs);

// A fresh empty temporary directory under /tmp, removed (with what it holds)
// when the test binary exits.
std::string makeTempDir(const std::string& prefix);

}  // namespace pipeforge::testing
