// The dataflow plan sends changed state from the stage that last changed it,
// or refuses the split naming the op, the value and the fix. Each case is a
// small model compiled here from TorchScript source, split, and run chained
// against the model itself (Note [Mutable state across stages]).
#include <gtest/gtest.h>

#include <torch/script.h>

#include <string>
#include <vector>

#include "partitioner/split_spec.h"
#include "stage/run_chained.h"
#include "stage/split_in_memory.h"

namespace pipeforge {
namespace {

// Three square linear maps `a`, `b`, `c` (no bias) and `forward` from `source`.
torch::jit::Module makeModel(const std::string& source, const std::string& extra_init = "") {
  torch::manual_seed(7);
  torch::jit::Module root("Root");
  for (const char* name : {"a", "b", "c"}) {
    torch::jit::Module lin(std::string("Lin_") + name);
    lin.register_parameter("weight", torch::randn({4, 4}) * 0.5, /*is_buffer=*/false);
    lin.define("def forward(self, x):\n    return torch.mm(x, self.weight)\n");
    root.register_module(name, lin);
  }
  if (extra_init == "steps") root.register_attribute("steps", c10::IntType::get(), 0);
  if (extra_init == "counter") {
    // One module whose buffer one method changes and another reads.
    torch::jit::Module counter("Counter");
    counter.register_buffer("count", torch::zeros({1}));
    counter.define("def bump(self):\n    self.count.add_(1)\n\ndef forward(self, x):\n    return x * self.count\n");
    root.register_module("counter", counter);
  }

  root.define(source);
  return root;
}

struct DataflowCase {
  std::string name;
  std::string source;
  std::string spec;
  std::vector<std::string> refused;  // empty: the split must reproduce the model
  std::string extra_init;
};

std::ostream& operator<<(std::ostream& os, const DataflowCase& c) { return os << c.name; }

class Dataflow : public ::testing::TestWithParam<DataflowCase> {};

TEST_P(Dataflow, SplitReproducesTheModelOrIsRefused) {
  const DataflowCase& c = GetParam();
  auto model = makeModel(c.source, c.extra_init);
  auto spec = partitioner::parseSplitSpec(c.spec, "test spec");
  if (!c.refused.empty()) {
    try {
      stage::splitInMemory(model, spec);
      FAIL() << "the split should have been refused";
    } catch (const stage::StageBuildError& e) {
      std::string message = e.what();
      for (const auto& fragment : c.refused) {
        EXPECT_NE(message.find(fragment), std::string::npos) << "missing '" << fragment << "' in:\n" << message;
      }
    }
    return;
  }
  auto reference = model.deepcopy();
  auto result = stage::splitInMemory(model, spec);
  torch::NoGradGuard no_grad;
  auto x = torch::randn({3, 4});
  for (int step = 0; step < 2; ++step) {
    auto expected = reference.forward({x}).toTensor();
    auto outputs = stage::runChained(result.stages.modules, result.stages.manifest, {x.clone()});
    ASSERT_EQ(outputs.size(), 1u);
    EXPECT_LE((outputs[0] - expected).abs().max().item<double>(), 1e-6) << "forward " << step;
  }
}

const std::vector<DataflowCase> kCases = {
    {"TensorChangedInPlaceAfterItCrossed", R"(
def forward(self, x):
    h = self.a.forward(x)
    y = self.b.forward(h)
    h.mul_(3)
    z = self.c.forward(y)
    return z + h
)",
     "split_points: {b: BEGINNING, c: BEGINNING}",
     {}},
    {"ListMadeAndReadLaterUnchanged", R"(
def forward(self, x):
    h = self.a.forward(x)
    hs = [h, h * 2]
    y = self.b.forward(h)
    return self.c.forward(y) + torch.stack(hs).sum(0)
)",
     "split_points: {b: BEGINNING, c: BEGINNING}",
     {}},
    {"ListClearedAndRefilled", R"(
def forward(self, x):
    hs: List[Tensor] = [x]
    h = self.a.forward(x)
    hs.clear()
    hs.append(h)
    hs.extend([h * 2, h * 3])
    y = self.b.forward(h)
    hs[1] = y
    del hs[0]
    hs.reverse()
    return self.c.forward(y) + torch.cat(hs, 1).sum(1, keepdim=True)
)",
     "split_points: {b: BEGINNING, c: BEGINNING}",
     {}},
    {"DictSetDefaultAndPop", R"(
def forward(self, x):
    d: Dict[str, Tensor] = {"x": x}
    h = self.a.forward(x)
    d["h"] = h
    d.setdefault("x", h)
    y = self.b.forward(h)
    d.pop("x")
    d["y"] = y
    return self.c.forward(y) + d["h"] + torch.stack(list(d.values())).sum(0)
)",
     "split_points: {b: BEGINNING, c: BEGINNING}",
     {}},
    {"ListGrownWithPlusEquals", R"(
def forward(self, x):
    hs: List[Tensor] = []
    h = self.a.forward(x)
    hs += [h]
    y = self.b.forward(h)
    hs += [y, y * 2]
    return self.c.forward(y) + torch.stack(hs).sum(0)
)",
     "split_points: {b: BEGINNING, c: BEGINNING}",
     {}},
    {"LengthReadBeforeTheListGrew", R"(
def forward(self, x):
    hs: List[Tensor] = []
    h = self.a.forward(x)
    hs.append(h)
    n = len(hs)
    hs.append(h * 2)
    y = self.b.forward(h)
    return y * n + torch.stack(hs).sum(0)
)",
     "split_points: {b: BEGINNING}",
     {"%n", "aten::len", "used in stage 1", "aten::append", "move the split"}},
    {"ListOfIntsChangedAcrossTheCut", R"(
def forward(self, x):
    sizes: List[int] = []
    h = self.a.forward(x)
    sizes.append(h.size(0))
    y = self.b.forward(h)
    return y * len(sizes)
)",
     "split_points: {b: BEGINNING}",
     {"%sizes", "List[int]", "aten::append", "only lists of tensors", "move the split"}},
    {"ElementChangedWhileReachingTwice", R"(
def forward(self, x):
    h = self.a.forward(x)
    hs: List[Tensor] = []
    hs.append(h)
    y = self.b.forward(h)
    hs[0].mul_(2)
    return y + h + torch.stack(hs).sum(0)
)",
     "split_points: {b: BEGINNING}",
     {"stage 1 changes", "aten::mul_", "reaches stage 1 twice", "move the split"}},
    {"IntAttributeSetInOneStageReadInAnother", R"(
def forward(self, x):
    self.steps = self.steps + 1
    y = self.b.forward(self.a.forward(x))
    return y * self.steps
)",
     "split_points: {b: BEGINNING}",
     {"attribute `steps`", "prim::SetAttr", "stage 0", "stage 1", "only tensors", "move the split"},
     "steps"},
    {"BufferChangedByOneCallReadByAnotherCall", R"(
def forward(self, x):
    self.counter.bump()
    y = self.b.forward(self.a.forward(x))
    return self.counter.forward(y)
)",
     "split_points: {b: BEGINNING}",
     {"buffer `counter.count`", "aten::add_", "stage 0", "read in stage 1", "the call to `counter`",
      "inside a submodule call", "move the split"},
     "counter"},
    {"BufferChangedAndReadInOneStage", R"(
def forward(self, x):
    self.counter.bump()
    y = self.counter.forward(self.a.forward(x))
    return self.c.forward(self.b.forward(y))
)",
     "split_points: {b: BEGINNING}",
     {},
     "counter"},
    {"ListChangedInsideAnIf", R"(
def forward(self, x):
    hs: List[Tensor] = []
    h = self.a.forward(x)
    if bool(h.sum() > 0):
        hs.append(h)
    y = self.b.forward(h)
    hs.append(y)
    return self.c.forward(y) + torch.stack(hs).sum(0)
)",
     "split_points: {b: BEGINNING}",
     {"%hs", "prim::If", "length is known", "move the split"}},
};

INSTANTIATE_TEST_SUITE_P(Cases, Dataflow, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<DataflowCase>& info) { return info.param.name; });

TEST(DataflowPlan, TensorChangedInPlaceIsSentByTheStageThatChangedIt) {
  auto model = makeModel(kCases[0].source);
  auto result = stage::splitInMemory(model, partitioner::parseSplitSpec(kCases[0].spec, "t"));
  const auto& m = result.stages.manifest;
  ASSERT_EQ(m.num_stages, 3);
  // Stage 2 reads `h` after stage 1 multiplied it in place: from stage 1, not stage 0.
  bool from_stage_1 = false;
  for (const auto& in : m.stages[2].inputs) from_stage_1 = from_stage_1 || in.stage == 1;
  int from_stage_0 = 0;
  for (const auto& in : m.stages[2].inputs) from_stage_0 += in.stage == 0;
  EXPECT_TRUE(from_stage_1);
  EXPECT_EQ(from_stage_0, 0);
}

}  // namespace
}  // namespace pipeforge
