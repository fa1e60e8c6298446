#include "frontend/module_paths.h"

#include <torch/script.h>

#include <algorithm>

namespace pipeforge::frontend {

std::optional<std::string> attributePath(const torch::jit::Value* value) {
  std::vector<std::string> parts;
  const torch::jit::Value* v = value;
  while (true) {
    const torch::jit::Node* n = v->node();
    if (n->kind() == c10::prim::Param) {
      // Only the graph's first input (`self`) roots a module path.
      if (n->owningGraph()->inputs().empty() || n->owningGraph()->inputs()[0] != v) return std::nullopt;
      if (!v->type()->cast<c10::ClassType>()) return std::nullopt;
      break;
    }
    if (n->kind() != c10::prim::GetAttr) return std::nullopt;
    parts.push_back(n->s(c10::attr::name));
    v = n->input(0);
  }
  std::string path;
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) path = joinPath(path, *it);
  return path;
}

bool isWithin(const std::string& fqn, const std::string& ancestor) {
  if (ancestor.empty() || fqn == ancestor) return true;
  return fqn.size() > ancestor.size() && fqn.compare(0, ancestor.size(), ancestor) == 0 && fqn[ancestor.size()] == '.';
}

std::string joinPath(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

std::pair<std::string, std::string> splitPath(const std::string& fqn) {
  auto dot = fqn.rfind('.');
  if (dot == std::string::npos) return {"", fqn};
  return {fqn.substr(0, dot), fqn.substr(dot + 1)};
}

torch::jit::Module submoduleAt(const torch::jit::Module& root, const std::string& fqn) {
  torch::jit::Module m = root;
  if (fqn.empty()) return m;
  size_t start = 0;
  while (start <= fqn.size()) {
    size_t dot = fqn.find('.', start);
    m = m.attr(fqn.substr(start, dot == std::string::npos ? std::string::npos : dot - start)).toModule();
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return m;
}

std::vector<std::string> submodulePaths(const torch::jit::Module& module) {
  std::vector<std::string> paths;
  for (const auto& entry : module.named_modules()) {
    if (!entry.name.empty()) paths.push_back(entry.name);
  }
  return paths;
}

namespace {

size_t editDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::vector<std::string> nearestNames(const std::string& wanted, const std::vector<std::string>& candidates,
                                      size_t limit) {
  std::vector<std::pair<size_t, std::string>> scored;
  for (const auto& c : candidates) scored.emplace_back(editDistance(wanted, c), c);
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<std::string> out;
  for (const auto& [distance, name] : scored) {
    if (out.size() == limit) break;
    out.push_back(name);
  }
  return out;
}

}  // namespace pipeforge::frontend
