#include "inspect/text_view.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/script.h>

#include <algorithm>
#include <map>
#include <optional>
#include <sstream>

#include "frontend/pt2_import.h"
#include "inspect/pipe_values.h"
#include "stage/value_meta.h"

namespace pipeforge::inspect {
namespace {

bool classNotRecorded(const torch::jit::Module& m) {
  return m.type()->name() && m.type()->name()->name().rfind(frontend::kPt2ClassNotRecorded, 0) == 0;
}

// Why a module prints without its class: a .pt2 records none for a module
// forward never calls (frontend/pt2_import.h); "" for every other module.
std::string unknownClassNote(const torch::jit::Module& m) {
  if (!classNotRecorded(m)) return "";
  return "  # forward never calls it, so the .pt2 records no class for it";
}

// A setting as Python's repr writes it: 0.1, True, 'tanh', None, (2, 3).
std::optional<std::string> settingText(const c10::IValue& v) {
  if (v.isBool()) return v.toBool() ? "True" : "False";
  if (v.isInt()) return std::to_string(v.toInt());
  if (v.isDouble()) return fmt::format("{}", v.toDouble());
  if (v.isString()) return "'" + v.toStringRef() + "'";
  if (v.isNone()) return "None";
  if (v.isIntList()) return fmt::format("({})", fmt::join(v.toIntVector(), ", "));
  return std::nullopt;
}

// The settings of a module that holds no tensors, as PyTorch's extra_repr
// shows them: Dropout(inplace=False, p=0.1), GELU(approximate='tanh'): its
// class constants (__constants__ / Final) and plain attributes, by name.
// Sorted because LibTorch 1.13 keeps a class's constants in declaration
// order and 2.13 does not; the tree reads the same on both.
std::vector<std::string> settingsOf(const torch::jit::Module& m) {
  std::vector<std::string> settings;
  const auto& type = m.type();
  for (size_t i = 0; i < type->numConstants(); ++i) {
    if (auto text = settingText(type->getConstant(i))) settings.push_back(type->constantNames()[i] + "=" + *text);
  }
  for (size_t i = 0; i < type->numAttributes(); ++i) {
    const std::string& name = type->getAttributeName(i);
    if (name == "training" || name.rfind("_", 0) == 0 || type->getAttribute(i)->cast<c10::ClassType>()) continue;
    if (auto text = settingText(m._ivalue()->getSlot(i))) settings.push_back(name + "=" + *text);
  }
  std::sort(settings.begin(), settings.end());
  return settings;
}

void printTree(const torch::jit::Module& m, int depth, std::ostringstream& out) {
  std::vector<std::string> tensors;
  for (const auto& p : m.named_parameters(false)) tensors.push_back(fmt::format("{}: [{}]", p.name, fmt::join(p.value.sizes(), ", ")));
  for (const auto& b : m.named_buffers(false)) tensors.push_back(fmt::format("{} (buffer): [{}]", b.name, fmt::join(b.value.sizes(), ", ")));
  auto children = m.named_children();
  if (children.size() == 0) {
    const std::vector<std::string> shown = tensors.empty() ? settingsOf(m) : tensors;
    out << className(m) << "(" << fmt::format("{}", fmt::join(shown, ", ")) << ")" << unknownClassNote(m) << "\n";
    return;
  }
  out << className(m) << "(" << unknownClassNote(m) << "\n";
  std::string pad(2 * (depth + 1), ' ');
  for (const auto& t : tensors) out << pad << t << "\n";
  for (const auto& child : children) {
    out << pad << "(" << child.name << "): ";
    printTree(child.value, depth + 1, out);
  }
  out << std::string(2 * depth, ' ') << ")\n";
}

std::string valueName(const PipeView& view, const stage::ValueSource& src) {
  return inspect::valueName(view.manifest, src);
}

// "x" or, with recorded meta, `x: "float32[6, 8]"` (as FX prints annotated code).
std::string annotatedInput(const PipeView& view, int index) {
  const stage::ValueSource input{stage::ValueSource::Kind::kInput, -1, index};
  const std::string meta = recordedMeta(view.manifest, input);
  const std::string name = valueName(view, input);
  if (meta.empty()) return name;
  auto parsed = stage::parseValueMeta(meta);
  return name + ": \"" + (parsed ? stage::formatValueMeta(*parsed) : meta) + "\"";
}

// "stage_0_1: float32[6, 8] (192 B)", or the bare name without recorded meta.
std::string describedValue(const PipeView& view, const stage::ValueSource& src) {
  const std::string described = describeValue(view.manifest, src);
  return valueName(view, src) + (described.empty() ? "" : ": " + described);
}

}  // namespace

std::string className(const torch::jit::Module& m) {
  if (classNotRecorded(m)) return "Module";
  std::string name = m.type()->name() ? m.type()->name()->name() : "Module";
  // Stage containers are Stage<k>_<path>: show them as PyTorch shows plain containers.
  if (name.rfind("Stage", 0) == 0 && name.find('_') != std::string::npos) return "Module";
  // Mangled names end in ___torch_mangle_N.
  auto mangle = name.find("___torch_mangle");
  return mangle == std::string::npos ? name : name.substr(0, mangle);
}

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
  std::vector<std::string> params;
  for (size_t i = 0; i < m.inputs.size(); ++i) params.push_back(annotatedInput(view, static_cast<int>(i)));
  out << "def forward(self, " << fmt::format("{}", fmt::join(params, ", ")) << "):\n";
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

std::string stageBoundaries(const PipeView& view) {
  const auto& m = view.manifest;
  if (m.num_stages < 2) return "";
  bool any_meta = false;
  for (const auto& s : m.stages) any_meta = any_meta || !s.output_meta.empty();
  if (!any_meta) {
    return "# values crossing each stage boundary: no shapes recorded; give the split spec example_inputs to see "
           "them\n";
  }
  std::ostringstream out;
  out << "# values crossing each stage boundary (dtype and shape from example_inputs):\n";
  for (int after = 0; after + 1 < m.num_stages; ++after) {
    for (const CrossingValue& c : valuesCrossing(m, after)) {
      const std::string to = c.to == m.num_stages ? "output" : fmt::format("stage {}", c.to);
      out << fmt::format("#   {}|{}  {}  (made by stage {}, last read by {})\n", after, after + 1, describedValue(view, c.value),
                         c.value.stage, to);
    }
    if (auto total = bytesCrossing(m, after)) out << fmt::format("#   {}|{}  total {} B\n", after, after + 1, *total);
  }
  return out.str();
}

std::string stageText(const PipeView& view, int stage) {
  std::ostringstream out;
  out << "stage_" << stage << ": ";
  printTree(view.stages.at(stage), 0, out);
  const auto& info = view.manifest.stages.at(stage);
  std::vector<std::string> inputs, outputs;
  for (const auto& in : info.inputs) inputs.push_back(describedValue(view, in));
  for (int i = 0; i < info.num_outputs; ++i) {
    outputs.push_back(describedValue(view, {stage::ValueSource::Kind::kStage, stage, i}));
  }
  out << "\ninputs:  " << fmt::format("{}", fmt::join(inputs, ", ")) << "\n";
  out << "outputs: " << fmt::format("{}", fmt::join(outputs, ", ")) << "\n";
  out << "\n" << view.stages.at(stage).get_method("forward").function().getSchema() << "\n\n";
  out << view.stages.at(stage).get_method("forward").graph()->toString();
  return out.str();
}

}  // namespace pipeforge::inspect
