// Dropout and batch norm that follow a module's train/eval mode, in graphs
// that fixed it when they were made (Note [Ops that follow the mode]).
#pragma once

#include <string>
#include <vector>

namespace torch::jit {
struct Module;
}

namespace pipeforge::frontend {

// Rewrites every method of `module` and its submodules so that the mode flag
// of dropout (aten::dropout and its feature/alpha variants, native_dropout),
// batch norm and instance norm with running statistics, and
// scaled_dot_product_attention's dropout_p, where the graph holds it as a
// constant, is read from the owning module's `training` attribute instead.
// A batch norm's num_batches_tracked increment runs only in train mode, as in
// nn.BatchNorm. Returns how many ops now follow the mode.
int followModuleMode(torch::jit::Module& module);

// Ops of `module` that draw random numbers whatever the mode (aten::rand,
// bernoulli, ...: a decomposed dropout, BART's layerdrop), which
// followModuleMode cannot switch off for evaluation: one line each,
// "model.layers.0 (aten::bernoulli_)", in module order.
std::vector<std::string> randomOpsIgnoringMode(const torch::jit::Module& module);

}  // namespace pipeforge::frontend
