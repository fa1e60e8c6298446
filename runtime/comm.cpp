#include "runtime/comm.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace pipeforge::runtime {
namespace {

class FinishedGather : public PendingOp {
 public:
  void wait() override {}
  bool done() override { return true; }
};

}  // namespace

std::string Communicator::describeRank(int rank) const {
  const std::string host = hostOf(rank);
  return host.empty() ? fmt::format("rank {}", rank) : fmt::format("rank {} (host {})", rank, host);
}

std::unique_ptr<PendingOp> Communicator::iallgather(const at::Tensor& in, const at::Tensor& out,
                                                    const std::vector<int>& group) {
  allgather(in, out, group);
  return std::make_unique<FinishedGather>();
}

void Communicator::allgather(const at::Tensor& in, const at::Tensor& out, const std::vector<int>& group) {
  const auto me = std::find(group.begin(), group.end(), rank());
  if (me == group.end() || out.numel() != in.numel() * static_cast<std::int64_t>(group.size())) {
    throw std::invalid_argument("allgather: this rank is not in the group, or the output is not group x input");
  }
  at::NoGradGuard no_grad;
  out.zero_();
  out.view({-1}).narrow(0, in.numel() * (me - group.begin()), in.numel()).copy_(in.reshape({-1}));
  allreduceSum(out, group);
}

void Communicator::reduceScatterSum(const at::Tensor& in, const at::Tensor& out, const std::vector<int>& group) {
  const auto me = std::find(group.begin(), group.end(), rank());
  if (me == group.end() || in.numel() != out.numel() * static_cast<std::int64_t>(group.size())) {
    throw std::invalid_argument("reduceScatterSum: this rank is not in the group, or the input is not group x output");
  }
  at::NoGradGuard no_grad;
  at::Tensor sum = in.reshape({-1}).clone();
  allreduceSum(sum, group);
  out.view({-1}).copy_(sum.narrow(0, out.numel() * (me - group.begin()), out.numel()));
}

}  // namespace pipeforge::runtime
