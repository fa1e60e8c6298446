#include "runtime/rng_state.h"

#include <mutex>

#include <ATen/Context.h>
#include <ATen/core/Generator.h>

namespace pipeforge::runtime {
namespace {

bool isCuda(const std::string& device) { return device.rfind("cuda", 0) == 0; }

// Generators are shared by every thread of the process (ranks as threads in
// the tests); their mutex orders a state swap against draws in progress.
at::Tensor stateOf(const c10::Device& d) {
  at::Generator gen = at::globalContext().defaultGenerator(d);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void setState(const c10::Device& d, const at::Tensor& state) {
  at::Generator gen = at::globalContext().defaultGenerator(d);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace

RngState captureRng(const std::string& device) {
  RngState s;
  s.cpu = stateOf(c10::Device(c10::kCPU));
  if (isCuda(device)) s.device = stateOf(c10::Device(device));
  return s;
}

void restoreRng(const std::string& device, const RngState& state) {
  setState(c10::Device(c10::kCPU), state.cpu);
  if (isCuda(device) && state.device.defined()) setState(c10::Device(device), state.device);
}

RngReplayGuard::RngReplayGuard(const std::string& device, const RngState& replay)
    : device_(device), saved_(captureRng(device)) {
  restoreRng(device_, replay);
}

RngReplayGuard::~RngReplayGuard() { restoreRng(device_, saved_); }

}  // namespace pipeforge::runtime
