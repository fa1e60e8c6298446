#include "stage/container_replay.h"

#include <fmt/format.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>

#include <algorithm>
#include <cstdint>

namespace pipeforge::stage {
namespace {

using torch::jit::Node;
using torch::jit::Value;

// Why a change cannot be replayed; thrown and caught inside this file only,
// so each step can stop where the original op would be ambiguous.
struct CannotReplay {
  std::string why;
};

// The key of a dict literal or _set_item, when it is a constant str or int.
std::optional<std::string> constantKey(const Value* v) {
  auto value = torch::jit::toIValue(v);
  if (!value) return std::nullopt;
  if (value->isString()) return "s:" + value->toStringRef();
  if (value->isInt()) return "i:" + std::to_string(value->toInt());
  return std::nullopt;
}

std::optional<int64_t> constantInt(const Value* v) {
  auto value = torch::jit::toIValue(v);
  if (!value || !value->isInt()) return std::nullopt;
  return value->toInt();
}

// Replays one change to one container; each method throws CannotReplay.
class ChangeReplay {
 public:
  ChangeReplay(const Node& n, bool is_dict, ContainerContents& c)
      : n_(n), is_dict_(is_dict), c_(c), size_(static_cast<int64_t>(c.elements.size())) {}

  void apply(const std::string& op, const std::function<bool(const Value*)>& is_changed_in_place) {
    if (op == "aten::clear") {
      c_ = ContainerContents{};
      return;
    }
    if (is_dict_) return applyToDict(op);
    applyToList(op, is_changed_in_place);
  }

 private:
  void applyToDict(const std::string& op) {
    if (op == "aten::_set_item" || op == "aten::setdefault") {
      auto [text, at] = key(1);
      if (at < size_) {
        if (op == "aten::_set_item") c_.elements[at] = n_.input(2);
        return;
      }
      c_.keys.push_back(n_.input(1));
      c_.key_text.push_back(text);
      c_.elements.push_back(n_.input(2));
      return;
    }
    if (op == "aten::pop" || op == "aten::Delete") {
      auto [text, at] = key(1);
      if (at < size_) erase(at);
      return;
    }
    throw CannotReplay{"in a way whose effect on its keys is not known"};
  }

  void applyToList(const std::string& op, const std::function<bool(const Value*)>& is_changed_in_place) {
    if (op == "aten::append") {
      c_.elements.push_back(n_.input(1));
    } else if (op == "aten::insert") {
      int64_t at = index(1, 0, /*inclusive_end=*/true);
      c_.elements.insert(c_.elements.begin() + at, n_.input(2));
    } else if (op == "aten::pop" || op == "aten::Delete") {
      erase(index(1, -1, /*inclusive_end=*/false));
    } else if (op == "aten::_set_item") {
      c_.elements[index(1, 0, /*inclusive_end=*/false)] = n_.input(2);
    } else if (op == "aten::reverse") {
      std::reverse(c_.elements.begin(), c_.elements.end());
    } else if (op == "aten::extend" || op == "aten::add_") {
      extend(n_.input(1), is_changed_in_place);
    } else {
      throw CannotReplay{"in a way whose effect on its length is not known"};
    }
  }

  // `l.extend(other)` / `l += other`: `other` must be a literal whose length no one changes.
  void extend(const Value* other, const std::function<bool(const Value*)>& is_changed_in_place) {
    bool unchanged = !is_changed_in_place(other);
    if (other->node()->kind() != c10::prim::ListConstruct || !unchanged) {
      throw CannotReplay{"with a list whose length is not known when splitting"};
    }
    c_.elements.insert(c_.elements.end(), other->node()->inputs().begin(), other->node()->inputs().end());
  }

  // Input `input` as a position in the list, `fallback` when the op omits it
  // (pop() pops the last). Negative indexes count from the end; an insert
  // position is clamped to [0, size] as Python does, any other must exist.
  int64_t index(size_t input, int64_t fallback, bool inclusive_end) const {
    std::optional<int64_t> i = input < n_.inputs().size() ? constantInt(n_.input(input)) : fallback;
    if (!i) throw CannotReplay{"with an index that is not a constant"};
    int64_t at = *i < 0 ? *i + size_ : *i;
    if (inclusive_end) return std::clamp<int64_t>(at, 0, size_);
    if (at < 0 || at >= size_) throw CannotReplay{fmt::format("with index {} outside its {} elements", *i, size_)};
    return at;
  }

  // Input `input` as a key, and the position of its element (size_ when new).
  std::pair<std::string, int64_t> key(size_t input) const {
    auto text = input < n_.inputs().size() ? constantKey(n_.input(input)) : std::nullopt;
    if (!text) throw CannotReplay{"with a key that is not a constant"};
    auto it = std::find(c_.key_text.begin(), c_.key_text.end(), *text);
    return std::make_pair(*text, static_cast<int64_t>(it - c_.key_text.begin()));
  }

  void erase(int64_t at) {
    c_.elements.erase(c_.elements.begin() + at);
    if (is_dict_) {
      c_.keys.erase(c_.keys.begin() + at);
      c_.key_text.erase(c_.key_text.begin() + at);
    }
  }

  const Node& n_;
  const bool is_dict_;
  ContainerContents& c_;
  const int64_t size_;  // before the change
};

}  // namespace

std::optional<std::string> readContainerLiteral(const Node& creator, ContainerContents& contents) {
  contents = ContainerContents{};
  if (creator.kind() != c10::prim::DictConstruct) {
    contents.elements.assign(creator.inputs().begin(), creator.inputs().end());
    return std::nullopt;
  }
  for (size_t i = 0; i + 1 < creator.inputs().size(); i += 2) {
    auto key = constantKey(creator.input(i));
    if (!key) return "its literal has a key that is not a constant";
    contents.keys.push_back(creator.input(i));
    contents.key_text.push_back(*key);
    contents.elements.push_back(creator.input(i + 1));
  }
  return std::nullopt;
}

std::optional<std::string> replayContainerChange(const Node& change, bool is_dict, ContainerContents& contents,
                                                 const std::function<bool(const Value*)>& is_changed_in_place) {
  try {
    ChangeReplay(change, is_dict, contents).apply(change.kind().toQualString(), is_changed_in_place);
  } catch (const CannotReplay& cannot) {
    return cannot.why;
  }
  return std::nullopt;
}

}  // namespace pipeforge::stage
