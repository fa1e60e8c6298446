// Replaying a list's or dict's in-place ops from its literal gives its
// elements after them, or says why they cannot be known when splitting
// (Note [Replaying a container's changes]).
#include <gtest/gtest.h>

#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/ir/irparser.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "stage/container_replay.h"

namespace pipeforge {
namespace {

using stage::ContainerContents;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

// An in-place op on a container: its kind and the names of its inputs after
// the container ("aten::insert", {"zero", "c"}).
struct Change {
  std::string op;
  std::vector<std::string> args;
};

// A graph parsed from IR text, with its values by their names in the text.
class ParsedGraph {
 public:
  explicit ParsedGraph(const std::string& ir) : graph_(std::make_shared<Graph>()) {
    torch::jit::parseIR(ir, graph_.get(), values_);
  }
  Value* operator[](const std::string& name) const {
    auto it = values_.find(name);
    if (it == values_.end()) throw std::runtime_error("no value %" + name + " in the test graph");
    return it->second;
  }
  // The node doing `change` (many ops have no output to name it by).
  const Node& find(const Change& change) const {
    for (const Node* n : graph_->nodes()) {
      if (n->kind().toQualString() != change.op || n->inputs().size() != change.args.size() + 1) continue;
      bool same = true;
      for (size_t i = 0; i < change.args.size(); ++i) same = same && n->input(i + 1) == (*this)[change.args[i]];
      if (same) return *n;
    }
    throw std::runtime_error("no " + change.op + " with these inputs in the test graph");
  }

 private:
  std::shared_ptr<Graph> graph_;
  std::unordered_map<std::string, Value*> values_;
};

bool neverChanged(const Value*) { return false; }

// Reads the literal that makes `container`, then replays `changes` in order;
// the first reason to stop, or nullopt.
std::optional<std::string> replay(const ParsedGraph& g, const std::string& container,
                                  const std::vector<Change>& changes, ContainerContents& c,
                                  bool (*is_changed)(const Value*) = neverChanged) {
  const Node& creator = *g[container]->node();
  if (auto why = stage::readContainerLiteral(creator, c)) return why;
  const bool is_dict = creator.kind() == c10::prim::DictConstruct;
  for (const auto& change : changes) {
    if (auto why = stage::replayContainerChange(g.find(change), is_dict, c, is_changed)) return why;
  }
  return std::nullopt;
}

std::vector<const Value*> values(const ParsedGraph& g, const std::vector<std::string>& names) {
  std::vector<const Value*> out;
  for (const auto& name : names) out.push_back(g[name]);
  return out;
}

const char* kListIR = R"IR(
graph(%a : Tensor, %b : Tensor, %c : Tensor, %d : Tensor, %i : int):
  %zero : int = prim::Constant[value=0]()
  %minus_one : int = prim::Constant[value=-1]()
  %hundred : int = prim::Constant[value=100]()
  %five : int = prim::Constant[value=5]()
  %feats : Tensor[] = prim::ListConstruct(%a)
  %more : Tensor[] = prim::ListConstruct(%c, %d)
  %1 : Tensor[] = aten::append(%feats, %b)
  aten::insert(%feats, %zero, %c)
  %2 : Tensor = aten::pop(%feats)
  aten::insert(%feats, %hundred, %d)
  %3 : Tensor[] = aten::_set_item(%feats, %minus_one, %b)
  aten::reverse(%feats)
  %4 : Tensor = aten::pop(%feats, %zero)
  aten::clear(%feats)
  %5 : Tensor = aten::pop(%feats, %i)
  %6 : Tensor[] = aten::_set_item(%feats, %five, %b)
  aten::sort(%feats)
  aten::extend(%feats, %more)
  %7 : Tensor[] = aten::add_(%feats, %more)
  return (%feats)
)IR";

TEST(ContainerReplay, ListOpsFromTheNote) {
  ParsedGraph g(kListIR);
  ContainerContents c;
  EXPECT_EQ(replay(g, "feats", {{"aten::append", {"b"}}, {"aten::insert", {"zero", "c"}}, {"aten::pop", {}}}, c),
            std::nullopt);
  EXPECT_EQ(c.elements, values(g, {"c", "a"}));
  EXPECT_TRUE(c.keys.empty());
}

TEST(ContainerReplay, ListIndexesCountFromTheEndAndInsertClamps) {
  ParsedGraph g(kListIR);
  ContainerContents c;
  // [a] -> [a, b] -> [a, b, d] -> [a, b, b] -> [b, b, a] -> pop(0) leaves [b, a]
  EXPECT_EQ(replay(g, "feats",
                   {{"aten::append", {"b"}},
                    {"aten::insert", {"hundred", "d"}},
                    {"aten::_set_item", {"minus_one", "b"}},
                    {"aten::reverse", {}},
                    {"aten::pop", {"zero"}}},
                   c),
            std::nullopt);
  EXPECT_EQ(c.elements, values(g, {"b", "a"}));
  EXPECT_EQ(replay(g, "feats", {{"aten::append", {"b"}}, {"aten::clear", {}}}, c), std::nullopt);
  EXPECT_TRUE(c.elements.empty());
}

TEST(ContainerReplay, ListExtendedByAnUnchangedLiteral) {
  ParsedGraph g(kListIR);
  ContainerContents c;
  EXPECT_EQ(replay(g, "feats", {{"aten::extend", {"more"}}, {"aten::add_", {"more"}}}, c), std::nullopt);
  EXPECT_EQ(c.elements, values(g, {"a", "c", "d", "c", "d"}));
  EXPECT_EQ(replay(g, "feats", {{"aten::extend", {"more"}}}, c, [](const Value*) { return true; }),
            "with a list whose length is not known when splitting");
}

TEST(ContainerReplay, ListChangesThatConstantsDoNotDecideAreRefused) {
  ParsedGraph g(kListIR);
  ContainerContents c;
  EXPECT_EQ(replay(g, "feats", {{"aten::pop", {"i"}}}, c), "with an index that is not a constant");
  EXPECT_EQ(replay(g, "feats", {{"aten::_set_item", {"five", "b"}}}, c), "with index 5 outside its 1 elements");
  EXPECT_EQ(replay(g, "feats", {{"aten::sort", {}}}, c), "in a way whose effect on its length is not known");
}

const char* kDictIR = R"IR(
graph(%x : Tensor, %y : Tensor, %z : Tensor, %name : str):
  %ka : str = prim::Constant[value="a"]()
  %kb : str = prim::Constant[value="b"]()
  %kc : str = prim::Constant[value="c"]()
  %d : Dict(str, Tensor) = prim::DictConstruct(%ka, %x, %kb, %y)
  %computed : Dict(str, Tensor) = prim::DictConstruct(%name, %x)
  aten::_set_item(%d, %ka, %z)
  %1 : Tensor = aten::setdefault(%d, %kb, %x)
  aten::_set_item(%d, %kc, %x)
  %2 : Tensor = aten::pop(%d, %ka)
  aten::Delete(%d, %ka)
  aten::_set_item(%d, %name, %x)
  aten::update(%d, %computed)
  return (%d)
)IR";

TEST(ContainerReplay, DictKeysAreReplayedInOrder) {
  ParsedGraph g(kDictIR);
  ContainerContents c;
  // {a: z, b: y} -> setdefault keeps b -> adds c -> pops a -> deleting a again changes nothing
  EXPECT_EQ(replay(g, "d",
                   {{"aten::_set_item", {"ka", "z"}},
                    {"aten::setdefault", {"kb", "x"}},
                    {"aten::_set_item", {"kc", "x"}},
                    {"aten::pop", {"ka"}},
                    {"aten::Delete", {"ka"}}},
                   c),
            std::nullopt);
  EXPECT_EQ(c.elements, values(g, {"y", "x"}));
  EXPECT_EQ(c.keys, values(g, {"kb", "kc"}));
  EXPECT_EQ(c.key_text, (std::vector<std::string>{"s:b", "s:c"}));
}

TEST(ContainerReplay, DictChangesThatConstantsDoNotDecideAreRefused) {
  ParsedGraph g(kDictIR);
  ContainerContents c;
  EXPECT_EQ(replay(g, "d", {{"aten::_set_item", {"name", "x"}}}, c), "with a key that is not a constant");
  EXPECT_EQ(replay(g, "d", {{"aten::update", {"computed"}}}, c), "in a way whose effect on its keys is not known");
  EXPECT_EQ(replay(g, "computed", {}, c), "its literal has a key that is not a constant");
}

}  // namespace
}  // namespace pipeforge
