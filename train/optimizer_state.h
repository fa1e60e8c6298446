// A stage optimizer's state by parameter FQN, to and from torch::optim
// (Note [Optimizer state by name]).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "config/train_config.h"
#include "train/optimizer_factory.h"

namespace torch::optim {
class Optimizer;
}

namespace pipeforge::train {

// The state `optimizer` (built by makeOptimizer as `name`) holds for each of
// `parameters`, under that parameter's name. A tensor listed under two names
// (tied names within one stage) is saved under both.
StageOptimizerState optimizerStateByName(torch::optim::Optimizer& optimizer, OptimizerName name,
                                         const std::vector<NamedParameter>& parameters);

// Gives each of `parameters` the state `find(its name)` returns (nullptr: it
// keeps none, as a parameter never stepped). Throws CheckpointError, naming
// `origin` and the parameter, for a state that lacks a slot the optimizer
// needs or whose slot has another shape.
void setOptimizerStateByName(torch::optim::Optimizer& optimizer, OptimizerName name,
                             const std::vector<NamedParameter>& parameters,
                             const std::function<const ParameterOptimizerState*(const std::string&)>& find,
                             const std::string& origin);

}  // namespace pipeforge::train
