#include "frontend/pt2_operators.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <vector>

namespace pipeforge::frontend {

namespace {
constexpr const char* kOpsPrefix = "torch.ops.";
}  // namespace

std::optional<Pt2OpName> parsePt2OpTarget(const std::string& target) {
  if (target.rfind(kOpsPrefix, 0) != 0) return std::nullopt;
  std::string rest = target.substr(std::string(kOpsPrefix).size());
  auto first = rest.find('.');
  auto last = rest.rfind('.');
  if (first == std::string::npos || first == last) return std::nullopt;
  return Pt2OpName{rest.substr(0, first), rest.substr(first + 1, last - first - 1), rest.substr(last + 1)};
}

bool isPt2MarkerTarget(const std::string& target) {
  return target == "torch.ops.pippy._pipe_split.default" || target == "torch.ops.pipeforge.pipe_split.default";
}

bool isPt2HigherOrderTarget(const std::string& target) { return target.rfind(kPt2HigherOrderPrefix, 0) == 0; }

const std::map<std::string, std::string>& pt2SymbolicOps() {
  static const std::map<std::string, std::string> table = {
      {"_operator.add", "aten::add"},       {"_operator.sub", "aten::sub"},
      {"_operator.mul", "aten::mul"},       {"_operator.floordiv", "aten::floordiv"},
      {"_operator.mod", "aten::remainder"}, {"_operator.truediv", "aten::div"},
      {"_operator.neg", "aten::neg"},       {"_operator.pow", "aten::pow"},
      {"_operator.eq", "aten::eq"},         {"_operator.ne", "aten::ne"},
      {"_operator.lt", "aten::lt"},         {"_operator.le", "aten::le"},
      {"_operator.gt", "aten::gt"},         {"_operator.ge", "aten::ge"},
      {"_operator.and_", "aten::__and__"},  {"_operator.or_", "aten::__or__"},
      {"_operator.not_", "aten::__not__"},  {"torch.sym_not", "aten::__not__"},
      {"torch.sym_max", "prim::max"},       {"torch.sym_min", "prim::min"},
      {"torch.sym_float", "aten::Float"},   {"torch.sym_int", "aten::Int"},
      {"math.trunc", "aten::Int"},          {"math.ceil", "aten::ceil"},
      {"math.floor", "aten::floor"},        {"math.sqrt", "aten::sqrt"},
  };
  return table;
}

namespace {

void collectMissing(const nlohmann::ordered_json& graph, const std::function<bool(const Pt2OpName&)>& exists,
                    std::set<std::string>& missing) {
  for (const auto& node : graph.at("nodes")) {
    std::string target = node.at("target").get<std::string>();
    for (const auto& in : node.at("inputs")) {
      if (in.at("arg").contains("as_graph")) collectMissing(in.at("arg").at("as_graph").at("graph"), exists, missing);
    }
    if (isPt2MarkerTarget(target) || isPt2HigherOrderTarget(target)) continue;
    if (auto op = parsePt2OpTarget(target)) {
      if (!exists(*op)) missing.insert(op->display());
    }
  }
}

bool isAtenNamespace(const std::string& ns) {
  return ns == "aten" || ns == "prims" || ns == "quantized" || ns == "_quantized";
}

// What to do about custom ops with no C++ kernel: a known export option, else the general way out.
std::string customOpFix(const std::vector<std::string>& custom) {
  static const std::map<std::string, std::string> kFixes = {
      {"transformers::grouped_mm_fallback",
       "export the model with experts_implementation=\"batched_mm\" in its config (transformers' MoE layers then "
       "export to aten.bmm)"},
  };
  std::string fix;
  for (const auto& op : custom) {
    auto known = kFixes.find(op.substr(0, op.rfind('.')));
    if (known != kFixes.end()) fix = known->second;
  }
  if (fix.empty()) {
    fix = "register the op in C++ (TORCH_LIBRARY) and link it into pipeforge, or export the model without it";
  }
  return fix;
}

}  // namespace

std::set<std::string> missingPt2Operators(const nlohmann::ordered_json& graph,
                                          const std::function<bool(const Pt2OpName&)>& exists) {
  std::set<std::string> missing;
  collectMissing(graph, exists, missing);
  return missing;
}

std::string missingOperatorsMessage(const std::set<std::string>& missing, const std::string& torch_version) {
  std::vector<std::string> aten, custom;
  for (const auto& m : missing) (isAtenNamespace(m.substr(0, m.find("::"))) ? aten : custom).push_back(m);
  if (!custom.empty()) {
    return fmt::format("the graph calls {} {} that this LibTorch ({}) does not have: a custom op defined only in "
                       "Python (torch.library) has no C++ kernel, so no stage can run it; {}",
                       custom.size() == 1 ? "the custom op" : "custom ops", fmt::join(custom, ", "), torch_version,
                       customOpFix(custom));
  }
  return fmt::format("the graph calls operators that this LibTorch ({}) does not have: {}; the model was exported by "
                     "a newer torch than the LibTorch pipeforge links: re-export with torch {}",
                     torch_version, fmt::join(aten, ", "), torch_version);
}

}  // namespace pipeforge::frontend
