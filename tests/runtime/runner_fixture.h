// Helpers shared by the executor and runner tests: in-process ranks on
// threads, and the two-stage zoo mlp with its single-process reference.
#pragma once

#include <torch/script.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/fake_comm.h"
#include "runtime/pipeline_runner.h"
#include "tests/runtime/grad_check.h"
#include "tests/support/build_paths.h"

namespace pipeforge::runtime {

// Runs `body(rank, comm)` on `ranks` threads; returns what each produced.
template <class Body>
auto onThreads(int ranks, Body body, Matching matching = Matching::kByTag) {
  FakeWorld world(ranks, std::chrono::seconds(20), matching);
  using Result = decltype(body(0, std::shared_ptr<Communicator>()));
  std::vector<Result> results(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    std::shared_ptr<Communicator> comm = world.communicator(r);
    threads.emplace_back([&, r, comm] { results[r] = body(r, comm); });
  }
  for (auto& t : threads) t.join();
  return results;
}

// The two-stage zoo mlp with an MSE loss.
inline RunnerOptions mlpOptions(const std::string& schedule, int microbatches) {
  RunnerOptions o;
  o.split_dir = testing::splitsRoot() + "/mlp_2";
  o.schedule = schedule;
  o.num_microbatches = microbatches;
  o.loss = LossKind::kMse;
  return o;
}

// Gradients of the unsplit mlp on a batch, by FQN.
inline std::map<std::string, at::Tensor> mlpReference(const at::Tensor& x, const at::Tensor& y, double* loss) {
  torch::jit::Module full = torch::jit::load(std::string(PIPEFORGE_ZOO_DIR) + "/mlp.pt");
  at::Tensor l = at::mse_loss(full.forward({x}).toTensor(), y);
  l.backward();
  *loss = l.item<double>();
  std::map<std::string, at::Tensor> grads;
  for (const auto& p : full.named_parameters(true)) grads[p.name] = p.value.grad();
  return grads;
}

}  // namespace pipeforge::runtime
