#include "frontend/pt2_higher_order.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "frontend/pt2_archive.h"
#include "frontend/pt2_operators.h"

namespace pipeforge::frontend {

using json = nlohmann::ordered_json;

size_t pt2RegionBodyInput(Pt2RegionKind kind) {
  switch (kind) {
    case Pt2RegionKind::kGradMode: return 1;
    case Pt2RegionKind::kAutocast: return 4;
  }
  return 0;
}

std::string describePt2Region(const json& node, Pt2RegionKind kind, const std::string& path) {
  std::string what;
  if (kind == Pt2RegionKind::kAutocast) {
    what = "a torch.autocast region";
  } else {
    const json& enable = node.at("inputs").at(0).at("arg");
    bool on = enable.contains("as_bool") && enable.at("as_bool").is_boolean() && enable.at("as_bool").get<bool>();
    what = on ? "a torch.enable_grad() region" : "a torch.no_grad() region";
  }
  what += path.empty() ? " of forward" : " of " + path;
  std::string line = pt2SourceLine(node);
  const json& body = node.at("inputs").at(pt2RegionBodyInput(kind)).at("arg").at("as_graph").at("graph");
  for (const auto& inner : body.at("nodes")) {
    if (!line.empty()) break;
    line = pt2SourceLine(inner);
  }
  return line.empty() ? what : what + " (" + line + ")";
}

namespace {

// How to export a model without the higher-order op `op`.
std::string exportFixFor(const std::string& op) {
  if (op == "flex_attention" || op == "flex_attention_backward") {
    return "export the model with attn_implementation=\"sdpa\" (or \"eager\") in its config";
  }
  if (op == "tag_activation_checkpoint" || op == "checkpoint") {
    return "export without activation checkpointing (model.gradient_checkpointing_disable(), or no "
           "torch.utils.checkpoint in forward) and set pipeline.activation_checkpointing in the training config "
           "instead";
  }
  if (op == "auto_functionalized" || op == "auto_functionalized_v2" || op == "with_effects") {
    return "the model calls a custom op that mutates its inputs or has side effects; export with ops that return "
           "new tensors";
  }
  return "rewrite that part of forward without it, or keep it out of the exported model";
}

}  // namespace

std::string unsupportedHigherOrderMessage(const json& node, const std::string& where) {
  std::string op = node.at("target").get<std::string>().substr(std::string(kPt2HigherOrderPrefix).size());
  std::string line = pt2SourceLine(node);
  return fmt::format("{}{}: the higher-order op '{}' is not supported (cond, while_loop, "
                     "wrap_with_set_grad_enabled and wrap_with_autocast are); {}",
                     where, line.empty() ? "" : " at " + line, op, exportFixFor(op));
}

}  // namespace pipeforge::frontend
