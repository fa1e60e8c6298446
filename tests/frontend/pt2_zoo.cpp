#include "tests/frontend/pt2_zoo.h"
#include "tests/support/build_paths.h"

#include <limits>

namespace pipeforge::testing {

std::string pt2ZooPath(const std::string& name) { return std::string(PIPEFORGE_PT2_ZOO_DIR) + "/" + name + ".pt2"; }

Pt2Reference loadPt2Reference(const std::string& name) {
  auto holder = torch::jit::load(std::string(PIPEFORGE_PT2_ZOO_DIR) + "/" + name + ".ref.pt");
  Pt2Reference ref;
  for (const c10::IValue v : holder.attr("inputs").toList()) ref.inputs.push_back(v);
  for (const c10::IValue v : holder.attr("outputs").toList()) ref.outputs.push_back(v.toTensor());
  auto fill = [&](const char* names, const char* values, std::map<std::string, at::Tensor>& out) {
    auto n = holder.attr(names).toList();
    auto v = holder.attr(values).toList();
    for (size_t i = 0; i < n.size(); ++i) out[n.get(i).toStringRef()] = v.get(i).toTensor();
  };
  fill("state_names", "state_values", ref.state);
  for (const c10::IValue v : holder.attr("state_names").toList()) ref.state_order.push_back(v.toStringRef());
  fill("after_names", "after_values", ref.after);
  return ref;
}

double maxAbsDiff(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes()) return std::numeric_limits<double>::infinity();
  if (a.numel() == 0) return 0.0;
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

}  // namespace pipeforge::testing
