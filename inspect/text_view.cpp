#include "inspect/text_view.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/script.h>

#include <map>
#include <sstream>

namespace pipeforge::inspect {
namespace {

// The class name users wrote ("Linear"), not the qualified TorchScript name.
std::string className(const torch::jit::Module& m) {
  std::string name = m.type()->name() ? m.type()->name()->name() : "Module";
  // Stage containers are Stage<k>_<path>: show them as PyTorch shows plain containers.
  if (name.rfind("Stage", 0) == 0 && name.find('_') != std::string::npos) return "Module";
  // Mangled names end in ___torch_mangle_N.
  auto mangle = name.find("___torch_mangle");
  return mangle == std::string::npos ? name : name.substr(0, mangle);
}

void printTree(const torch::jit::Module& m, int depth, std::ostringstream& out) {
  std::vector<std::string> tensors;
  for (const auto& p : m.named_parameters(false)) tensors.push_back(fmt::format("{}: [{}]", p.name, fmt::join(p.value.sizes(), ", ")));
  for (const auto& b : m.named_buffers(false)) tensors.push_back(fmt::format("{} (buffer): [{}]", b.name, fmt::join(b.value.sizes(), ", ")));
  auto children = m.named_children();
  if (children.size() == 0) {
    out << className(m) << "(" << fmt::format("{}", fmt::join(tensors, ", ")) << ")\n";
    return;
  }
  out << className(m) << "(\n";
  std::string pad(2 * (depth + 1), ' ');
  for (const auto& t : tensors) out << pad << t << "\n";
  for (const auto& child : children) {
    out << pad << "(" << child.name << "): ";
    printTree(child.value, depth + 1, out);
  }
  out << std::string(2 * depth, ' ') << ")\n";
}

std::string valueName(const PipeView& view, const stage::ValueSource& src) {
  if (src.kind == stage::ValueSource::Kind::kInput) return view.manifest.inputs.at(src.index);
  if (view.manifest.stages.at(src.stage).num_outputs == 1) return fmt::format("stage_{}", src.stage);
  return fmt::format("stage_{}_{}", src.stage, src.index);
}

}  // namespace

std::string moduleTree(const PipeView& view) {
  std::ostringstream out;
  out << "Pipe(\n";
  for (size_t k = 0; k < view.stages.size(); ++k) {
    out << "  (stage_" << k << "): ";
    printTree(view.stages[k], 1, out);
  }
  out << ")\n";
  return out.str();
}

std::string rootDataflow(const PipeView& view) {
  const auto& m = view.manifest;
  std::ostringstream out;
  out << "def forward(self, " << fmt::format("{}", fmt::join(m.inputs, ", ")) << "):\n";
  if (!m.constant_inputs.empty()) {
    // Note [Constant inputs]: arguments the split baked in, as pipe.json records them.
    std::vector<std::string> baked;
    for (const auto& [name, value] : m.constant_inputs) baked.push_back(name + " = " + value);
    out << "    # constant_inputs, baked into the stages: " << fmt::format("{}", fmt::join(baked, ", ")) << "\n";
  }
  // Free each value after its last reader, as PyTorch's generated code does.
  std::map<std::string, int> last_use;
  for (int k = 0; k < m.num_stages; ++k) {
    for (const auto& in : m.stages[k].inputs) last_use[valueName(view, in)] = k;
  }
  for (const auto& o : m.outputs) last_use[valueName(view, o)] = m.num_stages;
  for (int k = 0; k < m.num_stages; ++k) {
    std::vector<std::string> args, results, freed;
    for (const auto& in : m.stages[k].inputs) args.push_back(valueName(view, in));
    for (int i = 0; i < m.stages[k].num_outputs; ++i) results.push_back(valueName(view, {stage::ValueSource::Kind::kStage, k, i}));
    for (const auto& a : args) {
      if (last_use[a] == k && std::find(freed.begin(), freed.end(), a) == freed.end()) freed.push_back(a);
    }
    std::string lhs = results.empty() ? "_" : fmt::format("{}", fmt::join(results, ", "));
    out << "    " << lhs << " = self.stage_" << k << "(" << fmt::format("{}", fmt::join(args, ", ")) << ")";
    for (const auto& f : freed) out << ";  " << f << " = None";
    out << "\n";
  }
  std::vector<std::string> outs;
  for (const auto& o : m.outputs) outs.push_back(valueName(view, o));
  out << "    return (" << fmt::format("{}", fmt::join(outs, ", ")) << (outs.size() == 1 ? ",)" : ")") << "\n";
  return out.str();
}

std::string stageText(const PipeView& view, int stage) {
  std::ostringstream out;
  out << "stage_" << stage << ": ";
  printTree(view.stages.at(stage), 0, out);
  out << "\n" << view.stages.at(stage).get_method("forward").function().getSchema() << "\n\n";
  out << view.stages.at(stage).get_method("forward").graph()->toString();
  return out.str();
}

}  // namespace pipeforge::inspect
