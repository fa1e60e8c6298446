#include "stage/changed_state_check.h"

#include <fmt/format.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/script.h>

#include <map>
#include <optional>

#include "stage/errors.h"
#include "stage/points_to.h"

namespace pipeforge::stage {
namespace {

// What makes two attributes of different stage modules the same memory: the
// tensor (or list, dict, object) they hold, or, for ints and strings, the name.
std::optional<const void*> identityOf(const c10::IValue& value) {
  if (value.isTensor()) return value.toTensor().unsafeGetTensorImpl();
  if (value.isList() || value.isGenericDict() || value.isTuple() || value.isObject()) return value.internalToPointer();
  return std::nullopt;
}

std::optional<c10::IValue> attributeAt(const torch::jit::Module& module, const std::string& fqn) {
  for (const auto& a : module.named_attributes(/*recurse=*/true)) {
    if (a.name == fqn) return a.value;
  }
  return std::nullopt;
}

}  // namespace

void checkChangedStateHeldOnce(const std::vector<torch::jit::Module>& stages) {
  for (size_t s = 0; s < stages.size(); ++s) {
    auto graph = stages[s].get_method("forward").graph();
    PointsTo pt(stages[s], *graph);
    std::map<std::string, std::string> written;  // fqn -> op
    for (const torch::jit::Node* n : graph->nodes()) {
      for (const MemoryWrite& w : pt.writes(n)) {
        const MemoryObject& obj = pt.object(w.object);
        if (obj.kind != MemoryObject::Kind::kAttribute) continue;
        for (const auto& fqn : obj.fqns) written.emplace(fqn, w.op);
      }
    }
    for (const auto& [fqn, op] : written) {
      auto value = attributeAt(stages[s], fqn);
      if (!value) continue;  // the contents of an attribute: its name is checked with the attribute
      auto identity = identityOf(*value);
      for (size_t l = 0; l < stages.size(); ++l) {
        if (l == s) continue;
        for (const auto& a : stages[l].named_attributes(/*recurse=*/true)) {
          if (a.value.isModule()) continue;
          auto other = identityOf(a.value);
          bool same = identity ? other && *other == *identity : a.name == fqn;
          if (!same) continue;
          throw StageBuildError(fmt::format(
              "`{}` is changed in place in stage {} by {}, and stage {} holds its own copy (as `{}`); the copies would "
              "drift apart; move the split so that `{}`'s writer and readers are in one stage",
              fqn, s, op, l, a.name, fqn));
        }
      }
    }
  }
}

}  // namespace pipeforge::stage
