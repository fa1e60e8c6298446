// Access to the PT2 test zoo (tests/models/generate_pt2_zoo.py).
#pragma once

#include <torch/script.h>

#include <map>
#include <string>
#include <vector>

namespace pipeforge::testing {

// Absolute path of PT2 zoo file `name` (e.g. "gpt" -> <build>/zoo_pt2/gpt.pt2).
std::string pt2ZooPath(const std::string& name);

struct Pt2Reference {
  std::vector<torch::jit::IValue> inputs;
  std::vector<at::Tensor> outputs;
  std::map<std::string, at::Tensor> state;  // state_dict before the forward
  std::vector<std::string> state_order;     // its keys in state_dict order
  std::map<std::string, at::Tensor> after;  // buffers after the forward
};

// The fixed inputs, outputs and state saved beside PT2 model `name`.
Pt2Reference loadPt2Reference(const std::string& name);

// Largest absolute difference between two equally shaped tensors (infinity when shapes differ).
double maxAbsDiff(const at::Tensor& a, const at::Tensor& b);

}  // namespace pipeforge::testing
