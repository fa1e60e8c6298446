// The higher-order ops of an exported graph (torch.ops.higher_order.*) as
// the importer sees them: the two that open a grad-mode or autocast region
// (Note [PT2 regions] in pt2_import.cpp), how such a region is named in
// messages, and the refusal of the ops that cannot be imported.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <string>

namespace pipeforge::frontend {

enum class Pt2RegionKind {
  kGradMode,  // wrap_with_set_grad_enabled(enable, body, *operands)
  kAutocast,  // wrap_with_autocast(device_type, dtype, enabled, cache_enabled, body, *operands)
};

// The position of the body subgraph among a region op's inputs; the
// operands follow it.
size_t pt2RegionBodyInput(Pt2RegionKind kind);

// What the region op `node`, run in module `path` ("" for forward), is and
// where forward opens it: "a torch.no_grad() region of model.rotary_emb
// (modeling_llama.py:98)". Export records no stack trace on the op itself,
// so the line is the first body node's that has one.
std::string describePt2Region(const nlohmann::ordered_json& node, Pt2RegionKind kind, const std::string& path);

// The refusal of a higher-order op other than cond, while_loop and the
// region ops: what it is, where forward calls it, and how to export without
// it. `where` names the node ("node 'x' (target)").
std::string unsupportedHigherOrderMessage(const nlohmann::ordered_json& node, const std::string& where);

}  // namespace pipeforge::frontend
