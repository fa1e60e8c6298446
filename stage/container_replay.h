// The elements of a list or dict literal after the in-place ops that change it.
//
// Note [Replaying a container's changes]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A list or dict that travels between stages travels as its tensors and is
// rebuilt where it is read (Note [Mutable state across stages] in
// stage_dataflow.cpp). Which tensors those are at the end of the sending stage
// is found when splitting, by replaying the top-level ops that change it from
// the literal that made it:
//
//     feats = [a]             # prim::ListConstruct   [a]
//     feats.append(b)         # aten::append          [a, b]
//     feats.insert(0, c)      # aten::insert          [c, a, b]
//     feats.pop()             # aten::pop             [c, a]
//
// Only what constants decide is replayed: an index or key that is computed,
// an index outside the list, or an op whose effect on the length (or keys) is
// unknown cannot be, and the replay says why in words that finish the
// planner's refusal ("stage 1 changes it (aten::insert at ...) <why>").
// Whether the node is top-level and changes only this container is the
// planner's to check, as it knows the memory.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace torch::jit {
struct Node;
struct Value;
}  // namespace torch::jit

namespace pipeforge::stage {

struct ContainerContents {
  std::vector<const torch::jit::Value*> elements;
  std::vector<const torch::jit::Value*> keys;  // dicts: one constant per element
  std::vector<std::string> key_text;           // dicts: each key as "s:name" or "i:3"
};

// The contents a prim::ListConstruct or prim::DictConstruct makes, into
// `contents`. Returns why it cannot be read (a key that is not a constant).
[[nodiscard]] std::optional<std::string> readContainerLiteral(const torch::jit::Node& creator,
                                                              ContainerContents& contents);

// Applies `change`, an op that changes the list (or dict, `is_dict`) its
// first input names, to `contents`. `is_changed_in_place` tells whether memory
// a value reaches is changed anywhere (a list added by `extend` must be a
// literal no one changes). Returns why the change cannot be replayed.
[[nodiscard]] std::optional<std::string> replayContainerChange(
    const torch::jit::Node& change, bool is_dict, ContainerContents& contents,
    const std::function<bool(const torch::jit::Value*)>& is_changed_in_place);

}  // namespace pipeforge::stage
