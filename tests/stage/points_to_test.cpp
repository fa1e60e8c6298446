// PointsTo reads TorchScript's alias annotations: which values share memory,
// what a list holds, and which top-level node writes what (also inside calls).
#include <gtest/gtest.h>

#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/ir/irparser.h>
#include <torch/script.h>

#include <algorithm>
#include <map>
#include <memory>
#include <unordered_map>

#include "frontend/load_model.h"
#include "stage/points_to.h"
#include "tests/support/zoo.h"

namespace pipeforge {
namespace {

using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

// A graph parsed from IR text, and its values by their names in the text.
class ParsedGraph {
 public:
  explicit ParsedGraph(const std::string& ir) : graph(std::make_shared<Graph>()) {
    torch::jit::parseIR(ir, graph.get(), values_);
  }
  Value* operator[](const std::string& name) const {
    auto it = values_.find(name);
    if (it == values_.end()) throw std::runtime_error("no value %" + name + " in the test graph");
    return it->second;
  }
  std::shared_ptr<Graph> graph;

 private:
  std::unordered_map<std::string, Value*> values_;
};

std::vector<stage::ObjectId> written(const stage::PointsTo& pt, const Node* n) {
  std::vector<stage::ObjectId> out;
  for (const auto& w : pt.writes(n)) out.push_back(w.object);
  std::sort(out.begin(), out.end());
  return out;
}

bool contains(const std::vector<stage::ObjectId>& set, const std::vector<stage::ObjectId>& items) {
  return std::all_of(items.begin(), items.end(),
                     [&](stage::ObjectId o) { return std::find(set.begin(), set.end(), o) != set.end(); });
}

TEST(PointsTo, ListElementsViewsAndInPlaceWrites) {
  ParsedGraph v(R"IR(
graph(%self : Tensor, %x : Tensor):
  %zero : int = prim::Constant[value=0]()
  %one : int = prim::Constant[value=1]()
  %shape : int[] = prim::ListConstruct(%one)
  %l : Tensor[] = prim::ListConstruct()
  %y : Tensor = aten::relu(%x)
  %r : Tensor[] = aten::append(%l, %y)
  %z : Tensor = aten::__getitem__(%l, %zero)
  %v : Tensor = aten::view(%z, %shape)
  %w : Tensor = aten::add_(%v, %one, %one)
  %s : Tensor = aten::stack(%l, %zero)
  return (%s)
)IR");
  torch::jit::Module module("M");
  stage::PointsTo pt(module, *v.graph);
  // The element read back is the tensor appended; its view shares its memory.
  EXPECT_EQ(pt.pointsTo(v["z"]), pt.pointsTo(v["y"]));
  EXPECT_EQ(pt.pointsTo(v["v"]), pt.pointsTo(v["y"]));
  // append returns the list itself; the list holds y.
  EXPECT_EQ(pt.pointsTo(v["r"]), pt.pointsTo(v["l"]));
  EXPECT_TRUE(contains(pt.reachable(v["l"]), pt.pointsTo(v["y"])));
  // append writes the list; add_ on the view writes y's memory; stack and relu write nothing.
  EXPECT_EQ(written(pt, v["r"]->node()), pt.pointsTo(v["l"]));
  EXPECT_EQ(written(pt, v["w"]->node()), pt.pointsTo(v["y"]));
  EXPECT_TRUE(pt.writes(v["s"]->node()).empty());
  EXPECT_TRUE(pt.writes(v["y"]->node()).empty());
  // relu makes new memory, not x's.
  EXPECT_NE(pt.pointsTo(v["y"]), pt.pointsTo(v["x"]));
  // Ints are not tracked.
  EXPECT_TRUE(pt.pointsTo(v["zero"]).empty());
}

TEST(PointsTo, DictItemsAndPop) {
  ParsedGraph v(R"IR(
graph(%self : Tensor, %x : Tensor, %y : Tensor):
  %ka : str = prim::Constant[value="a"]()
  %minus : int = prim::Constant[value=-1]()
  %d : Dict(str, Tensor) = prim::DictConstruct(%ka, %x)
  %kb : str = prim::Constant[value="b"]()
  %sd : Tensor = aten::setdefault(%d, %kb, %y)
  %l : Tensor[] = aten::values(%d)
  %p : Tensor = aten::pop(%l, %minus)
  return (%p)
)IR");
  torch::jit::Module module("M");
  stage::PointsTo pt(module, *v.graph);
  auto d_holds = pt.reachable(v["d"]);
  EXPECT_TRUE(contains(d_holds, pt.pointsTo(v["x"])));
  EXPECT_TRUE(contains(d_holds, pt.pointsTo(v["y"])));
  // values() is a new list holding the dict's tensors; pop may return either.
  EXPECT_NE(pt.pointsTo(v["l"]), pt.pointsTo(v["d"]));
  EXPECT_TRUE(contains(pt.pointsTo(v["p"]), pt.pointsTo(v["x"])));
  EXPECT_TRUE(contains(pt.pointsTo(v["p"]), pt.pointsTo(v["y"])));
  EXPECT_EQ(written(pt, v["p"]->node()), pt.pointsTo(v["l"]));
}

TEST(PointsTo, CallsAreReadForTheWritesTheyMake) {
  torch::jit::Module inner("Inner");
  inner.register_buffer("count", torch::zeros({1}));
  inner.define(R"(
def forward(self, x):
    self.count.add_(1)
    x.mul_(2)
    return x
)");
  torch::jit::Module root("Root");
  root.register_module("inner", inner);
  root.register_buffer("scale", torch::ones({1}));
  root.define(R"(
def forward(self, x):
    y = self.inner.forward(x)
    return y * self.scale
)");
  auto graph = root.get_method("forward").graph();
  stage::PointsTo pt(root, *graph);
  Node* call = nullptr;
  Node* mul = nullptr;
  for (Node* n : graph->nodes()) {
    if (n->kind() == c10::prim::CallMethod) call = n;
    if (n->kind() == c10::aten::mul) mul = n;
  }
  ASSERT_TRUE(call && mul);
  std::vector<std::string> names;
  for (const auto& w : pt.writes(call)) {
    const auto& obj = pt.object(w.object);
    names.push_back(obj.kind == stage::MemoryObject::Kind::kAttribute ? obj.name : "input");
    if (obj.kind == stage::MemoryObject::Kind::kAttribute) {
      EXPECT_NE(w.op.find("aten::add_"), std::string::npos) << w.op;
      EXPECT_NE(w.op.find("inside `inner`"), std::string::npos) << w.op;
    }
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"inner.count", "input"}));
  // The call returns its argument, and reads nothing it writes to `scale`.
  EXPECT_EQ(pt.pointsTo(call->output()), pt.pointsTo(graph->inputs()[1]));
  EXPECT_TRUE(pt.writes(mul).empty());
  auto attributes = pt.attributesTouched(call);
  ASSERT_EQ(attributes.size(), 1u);
  EXPECT_EQ(pt.object(attributes[0]).fqns, (std::vector<std::string>{"inner.count"}));
  EXPECT_TRUE(pt.object(attributes[0]).persistent());
  EXPECT_TRUE(pt.object(attributes[0]).is_tensor);
  EXPECT_FALSE(pt.object(attributes[0]).is_parameter);
}

TEST(PointsTo, ReadsEveryOpOfTheZooModels) {
  // An op the analysis cannot read counts as writing all its inputs, which
  // can refuse good splits: the zoo has none.
  for (const char* name : {"seed_example", "mlp", "mlp_traced", "gpt", "markers", "multi_io", "loop_model",
                           "list_across_cut", "list_grown_later", "dict_across_cut", "buffer_across_cut",
                           "shared_norm", "list_in_loop"}) {
    auto model = frontend::loadModel(testing::zooModelPath(name));
    auto graph = model.get_method("forward").graph();
    stage::PointsTo pt(model, *graph);
    EXPECT_EQ(pt.unreadOps(), std::vector<std::string>{}) << name;
  }
}

}  // namespace
}  // namespace pipeforge
