#include "frontend/pt2_module_tree.h"

#include <fmt/format.h>
#include <torch/script.h>

#include "frontend/errors.h"
#include "frontend/module_paths.h"
#include "frontend/pt2_archive.h"
#include "frontend/pt2_names.h"

namespace pipeforge::frontend {

struct Pt2ModuleTree::Impl {
  std::shared_ptr<torch::jit::CompilationUnit> cu = std::make_shared<torch::jit::CompilationUnit>();
  std::map<std::string, torch::jit::Module> modules;   // FQN -> its module
  std::map<std::string, std::string> types;            // FQN -> Python class, where a module stack records one
  std::map<std::string, std::vector<std::string>> tied;
  std::map<std::string, int> method_counts;             // "path|base" -> methods defined with that base

  // The module at `path`, made (with its parents) on first use.
  torch::jit::Module& moduleAt(const std::string& path) {
    auto it = modules.find(path);
    if (it != modules.end()) return it->second;
    auto type_it = types.find(path);
    torch::jit::Module m(c10::QualifiedName(pt2ClassName(type_it == types.end() ? "" : type_it->second)), cu,
                         /*shouldMangle=*/true);
    if (!m.hasattr("training")) m.register_attribute("training", c10::BoolType::get(), true);
    if (!path.empty()) {
      auto [parent, leaf] = splitPath(path);
      moduleAt(parent).register_module(leaf, m);
    }
    return modules.emplace(path, m).first->second;
  }
};

Pt2ModuleTree::Pt2ModuleTree(const Pt2Archive& archive) : impl_(std::make_unique<Impl>()) {
  std::vector<std::string> paths{""};
  for (const auto& node : archive.nodes()) {
    for (const auto& f : node.module_stack) {
      impl_->types.emplace(f.path, f.type);
      paths.push_back(f.path);
    }
  }
  // Modules in the model's definition order first, so that submodules (and
  // the parameters under them) are listed as torch lists them.
  std::vector<std::string> ordered = archive.moduleCallGraph();
  ordered.insert(ordered.end(), paths.begin(), paths.end());
  for (const auto& entry : archive.tensors()) ordered.push_back(splitPath(entry.fqn).first);
  for (const auto& path : ordered) impl_->moduleAt(path);
  // A value the archive holds in a checkpoint's other dtype (Note [Weights by
  // FQN]) is registered as a stand-in of the declared dtype on the meta
  // device, one per tie: a split that never runs the model converts it only
  // as it writes it; one that does calls fillConvertedWeights first.
  std::map<const void*, at::Tensor> stand_ins;
  auto valueOf = [&](const Pt2TensorEntry& entry) -> at::Tensor {
    if (entry.convert_to < 0) return archive.tensor(entry.fqn);
    const at::Tensor& held = archive.stored(entry.fqn);
    at::Tensor& stand_in = stand_ins[held.unsafeGetTensorImpl()];
    if (!stand_in.defined()) {
      stand_in = at::empty(held.sizes(), at::TensorOptions()
                                             .dtype(static_cast<at::ScalarType>(entry.convert_to))
                                             .device(at::kMeta));
      stand_in.set_requires_grad(held.requires_grad());
    }
    return stand_in;
  };
  for (const auto& entry : archive.tensors()) {
    auto [owner_path, name] = splitPath(entry.fqn);
    torch::jit::Module& owner = impl_->moduleAt(owner_path);
    if (owner.hasattr(name)) {
      throw Pt2Error("tensor '" + entry.fqn + "' has the name of a submodule; rename one of them");
    }
    owner.register_parameter(name, valueOf(entry), /*is_buffer=*/!entry.is_parameter);
  }
  for (const auto& a : archive.tensors()) {
    for (const auto& b : archive.tensors()) {
      if (archive.stored(a.fqn).is_same(archive.stored(b.fqn))) impl_->tied[a.fqn].push_back(b.fqn);
    }
  }
}

void fillConvertedWeights(const Pt2Archive& archive, torch::jit::Module& root) {
  std::vector<std::string> pending;
  for (const auto& entry : archive.tensors()) {
    if (entry.convert_to >= 0) pending.push_back(entry.fqn);
  }
  for (const std::string& fqn : pending) {
    auto [owner_path, name] = splitPath(fqn);
    torch::jit::Module owner = root;
    if (!owner_path.empty()) {
      std::size_t start = 0;
      while (start <= owner_path.size()) {
        const std::size_t dot = owner_path.find('.', start);
        const std::string part = owner_path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
        owner = owner.attr(part).toModule();
        if (dot == std::string::npos) break;
        start = dot + 1;
      }
    }
    owner.setattr(name, archive.tensor(fqn));  // converted once per tie
  }
}

Pt2ModuleTree::~Pt2ModuleTree() = default;
Pt2ModuleTree::Pt2ModuleTree(Pt2ModuleTree&&) noexcept = default;
Pt2ModuleTree& Pt2ModuleTree::operator=(Pt2ModuleTree&&) noexcept = default;

torch::jit::Module Pt2ModuleTree::root() const { return impl_->modules.at(""); }

std::shared_ptr<c10::ClassType> Pt2ModuleTree::typeOf(const std::string& path) const {
  return impl_->modules.at(path).type();
}

std::map<std::string, std::vector<std::string>> Pt2ModuleTree::tiedNames() const { return impl_->tied; }

std::string Pt2ModuleTree::defineMethod(const std::string& path, const std::string& base,
                                        std::shared_ptr<torch::jit::Graph> graph) {
  int& count = impl_->method_counts[path + "|" + base];
  std::string name = count == 0 ? base : fmt::format("{}_{}", base, count);
  ++count;
  auto type = typeOf(path);
  auto* fn = impl_->cu->create_function(c10::QualifiedName(*type->name(), name), std::move(graph));
  type->addMethod(fn);
  return name;
}

}  // namespace pipeforge::frontend
