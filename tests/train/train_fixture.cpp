#include "tests/train/train_fixture.h"

#include <fcntl.h>
#include <unistd.h>

#include <torch/optim.h>
#include <torch/script.h>
#include <torch/serialize.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "data/dataset.h"
#include "data/open_dataset.h"
#include "frontend/load_model.h"
#include "tests/support/build_paths.h"
#include "tests/support/zoo.h"
#include "train/lr_schedule.h"
#include "train/optimizer_factory.h"

namespace pipeforge::testing {

namespace fs = std::filesystem;

namespace {

// torchrun makes a torchelastic_* folder in TMPDIR for every run and leaves
// it there: the test binary's children get a TMPDIR of its own, which
// makeTempDir removes when the binary exits.
const bool kOwnTmpDir = [] {
  const std::string dir = makeTempDir("pf-tmp");
  return ::setenv("TMPDIR", dir.c_str(), 1) == 0;
}();

}  // namespace

TrainWorkspace::TrainWorkspace() : dir_(makeTempDir("pf-train-e2e")) {
  // gpt: uint16 tokens below its vocabulary of 64, with some structure to learn.
  std::ofstream tokens(dir_ + "/tokens.bin", std::ios::binary);
  for (int i = 0; i < 4096; ++i) {
    std::uint16_t t = static_cast<std::uint16_t>((i * 7 + (i / 13) * 3) % 64);
    tokens.write(reinterpret_cast<const char*>(&t), 2);
  }
  // mlp: inputs [256, 8] -> targets [256, 4], a fixed random linear map.
  at::manual_seed(5);
  at::Tensor x = at::randn({256, 8});
  at::Tensor y = at::tanh(x.matmul(at::randn({8, 4})));
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("inputs", x);
  dict.insert("targets", y);
  auto bytes = torch::pickle_save(dict);
  std::ofstream(dir_ + "/mlp.pt", std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TrainWorkspace::~TrainWorkspace() {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

std::string TrainWorkspace::writeConfig(const std::string& name, const RunSpec& s) const {
  const bool gpt = s.model == "gpt";
  const std::string data = gpt ? fmt::format("{{format: tokens, path: {}/tokens.bin, block_size: 16}}", dir_)
                               : fmt::format("{{format: tensors, path: {}/mlp.pt}}", dir_);
  std::string text = fmt::format(
      "model:\n  path: {}\n  {}\n"
      "pipeline: {{schedule: {}, microbatches: {}, stages_per_rank: {}, data_parallel: {}{}}}\n"
      "loss: {}\n"
      "optimizer: {}\n"
      "lr_schedule: {{warmup_steps: 1, min_lr: 1.0e-5}}\n"
      "data: {}\n"
      "training: {{steps: {}, global_batch_size: {}, seed: 11}}\n"
      "checkpoint: {{dir: {}, every: {}}}\n"
      "distributed: {{timeout_s: {}{}}}\n"
      "output: {{dir: {}{}}}\n{}",
      s.model_path.empty() ? zooModelPath(s.model) : s.model_path, s.split, s.schedule, s.microbatches, s.stages_per_rank, s.data_parallel, s.pipeline,
      gpt ? "cross_entropy" : "mse", s.optimizer, data, s.steps, s.batch, checkpointDir(name), s.checkpoint_every,
      s.timeout_s, s.distributed, outDir(name), s.output, s.extra);
  const std::string path = dir_ + "/" + name + ".yaml";
  std::ofstream(path) << text;
  return path;
}

std::string torchrunUnusable() {
  auto r = runCommand(
      fmt::format("'{}' -m torch.distributed.run --standalone --nproc_per_node 1 --no_python /bin/true 2>&1",
                  PIPEFORGE_PYTHON));
  if (r.exit_code == 0) return "";
  std::string last = r.output.substr(0, r.output.find_last_not_of('\n') + 1);
  return last.substr(last.rfind('\n') + 1);
}

pid_t startTrainInBackground(const std::string& config, const std::string& log) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execl(PIPEFORGE_BINARY, PIPEFORGE_BINARY, "train", "--config", config.c_str(), "--nproc", "2", nullptr);
    ::_exit(127);
  }
  return pid;
}

std::string readBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

bool catches(pid_t pid, int signal) {
  std::ifstream status(fmt::format("/proc/{}/status", pid));
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("SigCgt:", 0) == 0) return (std::stoull(line.substr(7), nullptr, 16) >> (signal - 1)) & 1;
  }
  return false;
}

CommandResult runPipeforge(const std::string& args) {
  return runCommand(std::string(PIPEFORGE_BINARY) + " " + args);
}

std::map<std::string, at::Tensor> exportedParameters(const std::string& checkpoint, const std::string& model_path,
                                                     const std::string& out_path) {
  auto r = runPipeforge(fmt::format("export '{}' --model '{}' --out '{}' --force", checkpoint, model_path, out_path));
  if (r.exit_code != 0) throw std::runtime_error("export failed:\n" + r.output);
  auto module = torch::jit::load(out_path);
  std::map<std::string, at::Tensor> out;
  for (const auto& p : module.named_parameters()) out[p.name] = p.value.detach();
  return out;
}

std::map<std::string, at::Tensor> trainReference(const train::TrainConfig& config) {
  // loadModel: a `.pt2` model trains as its import (Note [PT2 stage files]).
  torch::jit::Module model = frontend::loadModel(config.model.path);
  model.train();
  std::vector<train::NamedParameter> params;
  for (const auto& p : model.named_parameters()) params.push_back({p.name, p.value});
  auto optimizer = train::makeOptimizer(config.optimizer, params);
  auto data = train::openDataset(config.data, config.seed);
  for (std::int64_t step = 0; step < config.steps; ++step) {
    train::setLearningRate(*optimizer, train::learningRate(config.lr_schedule, config.optimizer.lr, step, config.steps));
    train::Batch batch = data->batch(train::DataSplit::kTrain, step, config.global_batch_size);
    std::vector<c10::IValue> inputs(batch.inputs.begin(), batch.inputs.end());
    at::Tensor out = model.forward(inputs).toTensor();
    at::Tensor loss = config.loss == train::LossName::kCrossEntropy
                          ? at::cross_entropy_loss(out.flatten(0, -2), batch.targets[0].flatten(), {},
                                                   at::Reduction::Mean, -1)
                          : at::mse_loss(out, batch.targets[0]);
    optimizer->zero_grad();
    loss.backward();
    optimizer->step();
  }
  std::map<std::string, at::Tensor> out;
  for (const auto& p : model.named_parameters()) out[p.name] = p.value.detach();
  return out;
}

std::vector<std::string> mismatches(const std::map<std::string, at::Tensor>& actual,
                                    const std::map<std::string, at::Tensor>& expected, double rtol, double atol) {
  std::vector<std::string> bad;
  for (const auto& [name, want] : expected) {
    auto it = actual.find(name);
    if (it == actual.end()) {
      bad.push_back(name + " (missing)");
      continue;
    }
    if (!at::allclose(it->second, want, rtol, atol)) {
      const double diff = (it->second - want).abs().max().item<double>();
      bad.push_back(fmt::format("{} (max abs diff {:.3g})", name, diff));
    }
  }
  if (actual.size() != expected.size()) bad.push_back("parameter count differs");
  return bad;
}

}  // namespace pipeforge::testing
