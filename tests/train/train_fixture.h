// What the end-to-end training tests share: data files, configs, running the
// CLI, and the single-process reference training to compare against.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "config/train_config.h"
#include "tests/support/run_command.h"

namespace pipeforge::testing {

// A run of the zoo's gpt (vocab 64, block 16) or mlp (8 -> 4) as YAML.
struct RunSpec {
  std::string model = "gpt";  // gpt | mlp
  std::string model_path;     // default: the zoo's file of `model`
  std::string split;          // inline split keys, e.g. "num_stages: 2"
  std::string schedule = "1F1B";
  int microbatches = 4;
  int stages_per_rank = 1;
  int data_parallel = 1;
  std::string optimizer = "{name: adamw, lr: 1.0e-3, weight_decay: 0.01}";
  int steps = 3;
  int batch = 8;
  int checkpoint_every = 0;  // 0: only at the end
  double timeout_s = 60;
  std::string extra;  // more top-level YAML
  std::string pipeline;  // more keys of pipeline:, e.g. ", microbatch_group_size: 3"
  std::string output;  // more keys of output:, e.g. ", trace: true"
  std::string distributed;  // more keys of distributed:, e.g. ", cpu_affinity: none"
};

class TrainWorkspace {
 public:
  TrainWorkspace();  // a fresh temporary folder with the data files
  ~TrainWorkspace();

  const std::string& dir() const { return dir_; }
  // Writes the config of `spec` with outputs under dir()/name; returns its path.
  std::string writeConfig(const std::string& name, const RunSpec& spec) const;
  std::string outDir(const std::string& name) const { return dir_ + "/" + name; }
  std::string checkpointDir(const std::string& name) const { return outDir(name) + "/ckpt"; }

 private:
  std::string dir_;
};

// Empty when the build's Python's torchrun can start a worker at all; else
// why not. (Debian 12's torch 1.13 torchrun fails under Python 3.11 before it
// starts any worker: `AttributeError: 'NoneType' object has no attribute 'get'`.)
std::string torchrunUnusable();

// A file's bytes; empty when it cannot be read (a log not yet written).
std::string readBytes(const std::string& path);

// Whether process `pid` has a handler for `signal` (SigCgt of /proc/PID/status).
bool catches(pid_t pid, int signal);

// `pipeforge <args>`, output captured.
CommandResult runPipeforge(const std::string& args);

// `pipeforge train --config CONFIG --nproc 2` started in the background, in a
// process group of its own (so that kill(-pid, ...) reaches the launcher and
// its ranks, as a terminal's Ctrl-C does), its output in `log`. Returns its pid.
pid_t startTrainInBackground(const std::string& config, const std::string& log);

// Exports the newest checkpoint of a run and returns the model's parameters by name.
std::map<std::string, at::Tensor> exportedParameters(const std::string& checkpoint, const std::string& model_path,
                                                     const std::string& out_path);

// Trains the original model in this process with the same batches,
// optimizer, learning rates and loss as the pipelined run of `config`.
std::map<std::string, at::Tensor> trainReference(const train::TrainConfig& config);

// The names whose tensors differ beyond rtol/atol (all of them checked).
std::vector<std::string> mismatches(const std::map<std::string, at::Tensor>& actual,
                                    const std::map<std::string, at::Tensor>& expected, double rtol, double atol);

}  // namespace pipeforge::testing
