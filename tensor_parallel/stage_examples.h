// The inputs a stage's tensor-parallel plan is made on: zeros of the dtypes
// and shapes the split saw. A torch.export stage file records them itself
// (each input's sizes, a dynamic one's example hint); a TorchScript split
// has them in pipe.json when its spec gave example_inputs (the model's
// input_meta, the earlier stages' output_meta).
#pragma once

#include <string>
#include <vector>

namespace at {
class Tensor;
}
namespace pipeforge::stage {
struct PipeManifest;
}

namespace pipeforge::tensor_parallel {

// Stage `stage`'s forward inputs, on `device`. Throws TpPlanError naming the
// fix when the split recorded no shape for one of them.
std::vector<at::Tensor> stageExampleInputs(const std::string& split_dir, const stage::PipeManifest& manifest, int stage,
                                           const std::string& device);

}  // namespace pipeforge::tensor_parallel
