// Backward of one stage and microbatch through the autograd engine: whole (B),
// or split into the input gradient (I) and the weight gradient (W) that zero
// bubble schedules run at different times.
//
// Note [Split backward]
// I runs the engine from the stage's roots (outputs, or the loss) asking only
// for the gradients of the stage inputs, with the graph kept. Along the way it
// captures the gradient arriving at every *boundary node*: a node on the path
// to an input that also feeds a weight-only subgraph (for y = x W^T + b, the
// AddmmBackward node). The engine computes a node's outputs only for the edges
// it needs, so I skips every weight-gradient product.
// W then runs the engine once, seeded at every boundary node with its
// captured gradient (and at the roots that do not lead to any input: a first
// stage fed integer tokens), asking only for the parameters. The boundary
// nodes' edges back to the input path are cut first (Note [Cutting the input
// path]), so nothing on the input path is walked or recomputed, and no
// boundary node's gradient flows into a lower one's twice.
#pragma once

#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

namespace pipeforge::runtime {

// What W needs after I: the captured boundary gradients and the graph.
class WeightGradWork {
 public:
  virtual ~WeightGradWork() = default;
  // Accumulates the parameters' gradients into their .grad and releases the
  // graph. Runs once: it cuts the graph's input path.
  virtual void run() = 0;
};

struct InputGradResult {
  std::vector<at::Tensor> input_grads;  // one per input; undefined where none arrives
  std::unique_ptr<WeightGradWork> weight;
};

// B: the gradients of `inputs` (leaves; undefined for those that do not
// require grad or receive none); parameter gradients accumulate into .grad.
// `roots[i]` receives `root_grads[i]`; roots that do not require grad and
// undefined grads are skipped.
std::vector<at::Tensor> backwardFull(const std::vector<at::Tensor>& roots, const std::vector<at::Tensor>& root_grads,
                                     const std::vector<at::Tensor>& inputs);

// I: as backwardFull for the inputs only; `params` are those W will fill.
InputGradResult backwardInput(const std::vector<at::Tensor>& roots, const std::vector<at::Tensor>& root_grads,
                              const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& params);

}  // namespace pipeforge::runtime
