#include "stage/run_chained.h"

#include <torch/script.h>

#include <chrono>

namespace pipeforge::stage {

std::vector<at::Tensor> runChained(std::vector<torch::jit::Module>& modules, const PipeManifest& manifest,
                                   const std::vector<c10::IValue>& inputs, std::vector<double>* stage_seconds,
                                   std::vector<std::vector<at::Tensor>>* stage_outputs_out) {
  std::vector<std::vector<at::Tensor>> outputs(manifest.num_stages);
  if (stage_seconds) stage_seconds->assign(manifest.num_stages, 0.0);
  for (int k = 0; k < manifest.num_stages; ++k) {
    std::vector<c10::IValue> args;
    for (const auto& src : manifest.stages[k].inputs) {
      args.push_back(src.kind == ValueSource::Kind::kInput ? inputs.at(src.index)
                                                           : c10::IValue(outputs.at(src.stage).at(src.index)));
    }
    auto start = std::chrono::steady_clock::now();
    auto result = modules[k].forward(args);
    if (stage_seconds) {
      (*stage_seconds)[k] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    for (const auto& e : result.toTupleRef().elements()) outputs[k].push_back(e.toTensor());
  }
  std::vector<at::Tensor> model_outputs;
  for (const auto& src : manifest.outputs) {
    model_outputs.push_back(src.kind == ValueSource::Kind::kInput ? inputs.at(src.index).toTensor()
                                                                  : outputs.at(src.stage).at(src.index));
  }
  if (stage_outputs_out) *stage_outputs_out = std::move(outputs);
  return model_outputs;
}

}  // namespace pipeforge::stage
