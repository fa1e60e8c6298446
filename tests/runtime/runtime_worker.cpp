// One rank of the multi-process runtime tests, started by runtime_dist_test
// through the local launcher (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set).
//
//   runtime_worker accept SPLITS         every acceptance case for WORLD_SIZE ranks
//   runtime_worker checkpointing SPLITS  activation checkpointing against none, gpt_dropout
//   runtime_worker fail SPLITS R throw   rank R throws on its 3rd send, mid-step
//   runtime_worker fail SPLITS R die     rank R dies (SIGKILL) on its 3rd send
// Exit 0 when everything held; 1 with the reason on stderr otherwise.
#include <signal.h>

#include <iostream>

#include <ATen/Parallel.h>
#include <torch/script.h>

#include "runtime/c10d_comm.h"
#include "runtime/pipeline_runner.h"
#include "tests/runtime/grad_check.h"

namespace {

using namespace pipeforge;

// Passes everything through, except that on the chosen rank the n-th send fails.
class FailingComm : public runtime::Communicator {
 public:
  FailingComm(std::shared_ptr<runtime::Communicator> inner, int fail_rank, std::string how)
      : inner_(std::move(inner)), fail_rank_(fail_rank), how_(std::move(how)) {}

  int rank() const override { return inner_->rank(); }
  int worldSize() const override { return inner_->worldSize(); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  std::unique_ptr<runtime::PendingOp> isend(const at::Tensor& t, int dst, std::uint32_t tag) override {
    if (rank() == fail_rank_ && ++sends_ == 3) {
      if (how_ == "die") ::raise(SIGKILL);
      throw std::runtime_error("injected failure in the test worker");
    }
    return inner_->isend(t, dst, tag);
  }
  std::unique_ptr<runtime::PendingOp> irecv(const at::Tensor& t, int src, std::uint32_t tag) override {
    return inner_->irecv(t, src, tag);
  }
  void allreduceSum(const at::Tensor& t, const std::vector<int>& group) override { inner_->allreduceSum(t, group); }
  void barrier() override { inner_->barrier(); }
  void abort(const std::string& report) override { inner_->abort(report); }
  std::optional<std::string> abortReport() override { return inner_->abortReport(); }

 private:
  std::shared_ptr<runtime::Communicator> inner_;
  int fail_rank_;
  std::string how_;
  int sends_ = 0;
};

std::shared_ptr<runtime::Communicator> connect(std::chrono::milliseconds timeout) {
  runtime::C10dCommOptions o;
  o.env = runtime::resolveDistEnv({});
  o.timeout = timeout;
  return runtime::connectC10d(o);
}

int accept(const std::string& splits) {
  auto comm = connect(std::chrono::seconds(60));
  bool ok = true;
  for (const testing::GradCase& c : testing::acceptanceCases(comm->worldSize())) {
    testing::CaseReport r = testing::runGradCase(c, splits, comm);
    (r.ok ? std::cout : std::cerr) << r.message << std::endl;
    ok &= r.ok;
  }
  return ok ? 0 : 1;
}

// Activation checkpointing on gpt_dropout (tied embedding/head, dropout
// active): with against without, for GPipe, 1F1B and both zero-bubble schedules.
int checkpointing(const std::string& splits) {
  auto comm = connect(std::chrono::seconds(60));
  bool ok = true;
  for (const char* schedule : {"GPipe", "1F1B", "ZBVZeroBubble", "InterleavedZeroBubble"}) {
    testing::GradCase c;
    c.model = "gpt_dropout";
    c.schedule = schedule;
    c.ranks = comm->worldSize();
    c.stages_per_rank = testing::stagesPerRankFor(schedule);
    c.microbatches = 2 * c.ranks;
    testing::CaseReport r = testing::runCheckpointingCase(c, splits, comm);
    (r.ok ? std::cout : std::cerr) << r.message << std::endl;
    ok &= r.ok;
  }
  return ok ? 0 : 1;
}

int fail(const std::string& splits, int fail_rank, const std::string& how) {
  auto comm = std::make_shared<FailingComm>(connect(std::chrono::seconds(60)), fail_rank, how);
  runtime::RunnerOptions o;
  o.split_dir = splits + "/gpt_" + std::to_string(comm->worldSize());
  o.schedule = "1F1B";
  o.num_microbatches = 2 * comm->worldSize();
  o.loss = runtime::LossKind::kCrossEntropy;
  runtime::PipelineRunner runner(o, comm);
  torch::manual_seed(0);
  at::Tensor idx = torch::randint(0, 64, {8, 16});
  runner.trainStep({idx}, {idx});
  std::cout << "step finished" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  at::set_num_threads(1);
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.size() == 2 && args[0] == "accept") return accept(args[1]);
    if (args.size() == 2 && args[0] == "checkpointing") return checkpointing(args[1]);
    if (args.size() == 4 && args[0] == "fail") return fail(args[1], std::stoi(args[2]), args[3]);
    std::cerr << "usage: runtime_worker accept SPLITS | checkpointing SPLITS | fail SPLITS RANK throw|die\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "rank " << (std::getenv("RANK") ? std::getenv("RANK") : "?") << " error: " << e.what() << std::endl;
    return 1;
  }
}
