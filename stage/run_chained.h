// Running stage modules one after another, as the manifest chains them.
#pragma once

#include <vector>

#include "stage/manifest.h"

namespace at {
class Tensor;
}
namespace c10 {
struct IValue;
}
namespace torch::jit {
struct Module;
}

namespace pipeforge::stage {

// Runs the stages as the manifest chains them; returns the model outputs.
// `stage_seconds`, when given, receives each stage's wall time;
// `stage_outputs`, when given, each stage's outputs.
std::vector<at::Tensor> runChained(std::vector<torch::jit::Module>& modules, const PipeManifest& manifest,
                                   const std::vector<c10::IValue>& inputs,
                                   std::vector<double>* stage_seconds = nullptr,
                                   std::vector<std::vector<at::Tensor>>* stage_outputs = nullptr);

}  // namespace pipeforge::stage
