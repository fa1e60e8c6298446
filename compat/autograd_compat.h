// Autograd graph types whose spelling differs between LibTorch versions.
#pragma once

#include <torch/csrc/autograd/edge.h>

namespace pipeforge::compat {

// How an Edge holds its Node: std::shared_ptr in LibTorch 1.13,
// c10::intrusive_ptr in recent 2.x. Taken from Edge itself, not a version test.
using AutogradNodePtr = decltype(torch::autograd::Edge::function);

}  // namespace pipeforge::compat
