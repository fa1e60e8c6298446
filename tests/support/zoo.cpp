#include "tests/support/zoo.h"
#include "tests/support/build_paths.h"

#include <cstdlib>
#include <stdexcept>

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

std::string makeTempDir(const std::string& prefix) {
  std::string tmpl = "/tmp/" + prefix + "-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
  return buf.data();
}

}  // namespace pipeforge::testing
