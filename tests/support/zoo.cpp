#include "tests/support/zoo.h"
#include "tests/support/build_paths.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <system_error>
#include <vector>

namespace pipeforge::testing {

std::string zooModelPath(const std::string& name) {
  return std::string(PIPEFORGE_ZOO_DIR) + "/" + name + ".pt";
}

Reference loadReference(const std::string& name) {
  std::string path = std::string(PIPEFORGE_ZOO_DIR) + "/" + name + ".ref.pt";
  auto holder = torch::jit::load(path);
  Reference ref;
  for (const c10::IValue v : holder.attr("inputs").toList()) ref.inputs.push_back(v);
  for (const c10::IValue v : holder.attr("outputs").toList()) ref.outputs.push_back(v.toTensor());
  return ref;
}

std::vector<at::Tensor> runForward(torch::jit::Module& module, const std::vector<torch::jit::IValue>& inputs) {
  torch::NoGradGuard no_grad;
  auto out = module.forward(inputs);
  std::vector<at::Tensor> flat;
  if (out.isTuple()) {
    for (const auto& e : out.toTupleRef().elements()) flat.push_back(e.toTensor());
  } else {
    flat.push_back(out.toTensor());
  }
  return flat;
}

namespace {

// Every folder makeTempDir made, removed when the test binary exits (only by
// the process that made them: a forked child leaves its parent's alone).
class TempDirs {
 public:
  static TempDirs& instance() {
    static TempDirs dirs;
    return dirs;
  }
  void add(std::string dir) {
    std::lock_guard<std::mutex> lock(mutex_);
    dirs_.push_back(std::move(dir));
  }
  ~TempDirs() {
    if (getpid() != owner_) return;
    for (const std::string& dir : dirs_) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  }

 private:
  TempDirs() : owner_(getpid()) {}
  pid_t owner_;
  std::mutex mutex_;
  std::vector<std::string> dirs_;
};

}  // namespace

std::string makeTempDir(const std::string& prefix) {
  std::string tmpl = "/tmp/" + prefix + "-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
  TempDirs::instance().add(buf.data());
  return buf.data();
}

}  // namespace pipeforge::testing
