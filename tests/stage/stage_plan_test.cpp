// The stage analyses, text in, text out: a small model compiled here from
// TorchScript source and a split spec in; what each stage computes, receives
// and sends (planStages), and what its module tree holds (planStageModules),
// printed and compared. The last cases check that the builder follows the
// plan: the built modules hold exactly the entries planned.
#include "stage/stage_plan.h"

#include <gtest/gtest.h>

#include <torch/script.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tests/support/script_module.h"

#include "frontend/module_paths.h"
#include "partitioner/policy_search.h"
#include "partitioner/split_spec.h"
#include "stage/build_stages.h"

namespace pipeforge::stage {
namespace {

// Square linear maps `a`, `b`, `c`; a `counter` whose `bump` changes its
// buffer in place; a `blk` calling `blk.x` then `blk.y` and scaling by its
// parameter `blk.scale`, with an int `blk.n` and a buffer `blk.shift`.
torch::jit::Module makeModel(const std::string& forward) {
  torch::jit::Module root("Root");
  for (const char* name : {"a", "b", "c"}) root.register_module(name, testing::linear4(name));
  torch::jit::Module counter("Counter");
  counter.register_buffer("count", torch::zeros({1}));
  counter.define("def bump(self):\n    self.count.add_(1)\n\ndef forward(self, x):\n    return x * self.count\n");
  root.register_module("counter", counter);
  torch::jit::Module blk("Block");
  blk.register_module("x", testing::linear4("x"));
  blk.register_module("y", testing::linear4("y"));
  blk.register_parameter("scale", torch::full({1}, 2.0), /*is_buffer=*/false);
  blk.register_buffer("shift", torch::zeros({1}));
  blk.register_attribute("n", c10::IntType::get(), 3);
  blk.define("def forward(self, h):\n    z = self.x.forward(h)\n    return self.y.forward(z) * self.scale\n");
  root.register_module("blk", blk);
  root.define(forward);
  return root;
}

struct Split {
  partitioner::ChosenPartition chosen;
  SplitPlan plan;
};

Split plan(const torch::jit::Module& model, const std::string& spec) {
  auto chosen = partitioner::searchPartition(model, partitioner::parseSplitSpec(spec, "t"), {});
  SplitPlan p = planStages(chosen.opened, chosen.dag, chosen.partition);
  return {std::move(chosen), std::move(p)};
}

// The module tree of each stage as planned from the graph the builder made.
std::vector<std::string> plannedModules(const torch::jit::Module& model, const BuiltStages& built) {
  std::vector<std::string> out;
  for (const auto& stage : built.modules) {
    out.push_back(toString(planStageModules(model, *stage.get_method("forward").graph())));
  }
  return out;
}

struct PlanCase {
  std::string name;
  std::string forward;
  std::string spec;
  std::string plan;                  // toString(SplitPlan)
  std::vector<std::string> modules;  // toString(StageModules), per stage
};

std::ostream& operator<<(std::ostream& os, const PlanCase& c) { return os << c.name; }

class StagePlanCases : public ::testing::TestWithParam<PlanCase> {};

TEST_P(StagePlanCases, PlanAndModuleTreesAreAsExpected) {
  const PlanCase& c = GetParam();
  auto model = makeModel(c.forward);
  Split split = plan(model, c.spec);
  EXPECT_EQ(toString(split.plan), c.plan);
  BuiltStages built = buildStagesFromPlan(split.chosen.opened, split.chosen.dag, split.plan);
  EXPECT_EQ(plannedModules(model, built), c.modules);
}

const std::vector<PlanCase> kPlanCases = {
    {"ThreeCallsSplitTwice", R"(
def forward(self, x):
    h = self.a.forward(x)
    y = self.b.forward(h)
    out = self.c.forward(y)
    return out
)",
     "split_points: {b: BEGINNING, c: BEGINNING}",
     R"(model inputs: x
stage 0
  emits: call a
  input 0: model input 0, %x.1, named in0_x_1
  output 0: %h.1
stage 1
  emits: call b
  input 0: stage 0 output 0, %h.1, named in0_h_1
  output 0: %y.1
stage 2
  emits: call c
  input 0: stage 1 output 0, %y.1, named in0_y_1
  output 0: %out.1
model outputs: stage 2 output 0
)",
     {"whole a\n", "whole b\n", "whole c\n"}},
    {"ListChangedInStage0IsRebuiltInStage1", R"(
def forward(self, x):
    h = self.a.forward(x)
    hs = [h]
    hs.append(h * 2)
    y = self.b.forward(h)
    out = y + torch.stack(hs).sum(0)
    return out
)",
     "split_points: {b: BEGINNING}",
     R"(model inputs: x
stage 0
  emits: call a, prim::ListConstruct, aten::mul, aten::append
  input 0: model input 0, %x.1, named in0_x_1
  output 0: %h.1
  output 1: %hs.1[0]
  output 2: %hs.1[1]
stage 1
  emits: call b, aten::stack, prim::ListConstruct, aten::sum, aten::add
  input 0: stage 0 output 0, %h.1, named in0_h_1
  input 1: stage 0 output 1, %hs.1[0], named in1_hs_1_0
  input 2: stage 0 output 2, %hs.1[1], named in2_hs_1_1
  rebuilds list %hs.1 from inputs 1, 2
  output 0: %out.1
model outputs: stage 1 output 0
)",
     {"whole a\n", "whole b\n"}},
    {"BufferChangedInStage0IsSentToStage1", R"(
def forward(self, x):
    self.counter.bump()
    h = self.a.forward(x)
    y = self.b.forward(h)
    out = y * self.counter.count
    return out
)",
     "split_points: {b: BEGINNING}",
     R"(model inputs: x
stage 0
  emits: call counter (bump), call a
  input 0: model input 0, %x.1, named in0_x_1
  output 0: %h.1
  output 1: attribute counter.count
stage 1
  emits: call b, aten::mul
  input 0: stage 0 output 0, %h.1, named in0_h_1
  input 1: stage 0 output 1, attribute counter.count, named in1_counter_count
  output 0: %out.1
model outputs: stage 1 output 0
)",
     {"whole a\nwhole counter\n", "whole b\n"}},
    // Stage 0 computes the size too (it is its node) but nothing there reads
    // it: dead code, so stage 0 holds no `c` (Note [Stage module trees]).
    {"SizeRecomputedLaterIsNoReadOfTheStageThatDropsIt", R"(
def forward(self, x):
    h = self.a.forward(x)
    n = self.c.weight.size(0)
    y = self.b.forward(h)
    out = y * n
    return out
)",
     "split_points: {b: BEGINNING}",
     R"(model inputs: x
stage 0
  emits: call a, aten::size
  input 0: model input 0, %x.1, named in0_x_1
  output 0: %h.1
stage 1
  emits: aten::size, call b, aten::mul
  input 0: stage 0 output 0, %h.1, named in0_h_1
  output 0: %out.1
model outputs: stage 1 output 0
)",
     {"whole a\n", "whole b\nopened c\nparameter c.weight\n"}},
    {"SplitInsideABlockOpensIt", R"(
def forward(self, x):
    out = self.blk.forward(self.a.forward(x))
    return out
)",
     "split_points: {blk.y: BEGINNING}",
     R"(model inputs: x
stage 0
  emits: call a, call blk.x
  input 0: model input 0, %x.1, named in0_x_1
  output 0: %z.1
stage 1
  emits: call blk.y, aten::mul
  input 0: stage 0 output 0, %z.1, named in0_z_1
  output 0: %out.1
model outputs: stage 1 output 0
)",
     {"whole a\nopened blk\nwhole blk.x\n", "opened blk\nwhole blk.y\nparameter blk.scale\n"}},
};

INSTANTIATE_TEST_SUITE_P(StagePlan, StagePlanCases, ::testing::ValuesIn(kPlanCases),
                         [](const auto& info) { return info.param.name; });

TEST(StageModules, WholeCallsOpenedReadsAndEveryKindOfAttribute) {
  // The model's own forward graph: `a` and `blk.x` are called, `blk` is only
  // read into, so it is opened with what is read of it.
  auto model = makeModel(R"(
def forward(self, x):
    h = self.a.forward(x) * self.blk.scale + self.blk.shift
    return self.blk.x.forward(h) * self.blk.n
)");
  auto modules = planStageModules(model, *model.get_method("forward").graph());
  EXPECT_EQ(toString(modules),
            "whole a\n"
            "opened blk\n"
            "whole blk.x\n"
            "attribute blk.n\n"
            "parameter blk.scale\n"
            "buffer blk.shift\n");
}

TEST(StageModules, AWholeModuleCoversWhatIsReadInsideIt) {
  auto model = makeModel(R"(
def forward(self, x):
    return self.blk.forward(x) * self.blk.scale + self.blk.x.forward(x)
)");
  EXPECT_EQ(toString(planStageModules(model, *model.get_method("forward").graph())), "whole blk\n");
}

TEST(StageModules, TheBuiltModulesHoldWhatWasPlanned) {
  auto model = makeModel(R"(
def forward(self, x):
    self.counter.bump()
    h = self.blk.forward(self.a.forward(x)) * self.blk.n
    return self.c.forward(self.b.forward(h)) + self.blk.shift
)");
  Split split = plan(model, "split_points: {blk.y: BEGINNING, c: BEGINNING}");
  BuiltStages built = buildStagesFromPlan(split.chosen.opened, split.chosen.dag, split.plan);
  ASSERT_EQ(built.modules.size(), 3u);
  for (size_t k = 0; k < built.modules.size(); ++k) {
    const torch::jit::Module& stage = built.modules[k];
    StageModules planned = planStageModules(model, *stage.get_method("forward").graph());
    SCOPED_TRACE("stage " + std::to_string(k) + " planned:\n" + toString(planned));
    std::vector<std::string> tensors;  // what the plan says the stage holds
    auto add_state_of = [&](const torch::jit::Module& whole, const std::string& fqn) {
      for (const auto& p : whole.named_parameters(true)) tensors.push_back(fqn + "." + p.name);
      for (const auto& b : whole.named_buffers(true)) tensors.push_back(fqn + "." + b.name);
    };
    for (const StageModuleEntry& e : planned.entries) {
      switch (e.kind) {
        case StageModuleEntry::Kind::kOpened:
          EXPECT_NE(frontend::submoduleAt(stage, e.fqn).type()->name()->qualifiedName().find("pipeforge_split"),
                    std::string::npos)
              << e.fqn << " should be a new container";
          break;
        case StageModuleEntry::Kind::kWhole:
          EXPECT_EQ(frontend::submoduleAt(stage, e.fqn)._ivalue().get(),
                    frontend::submoduleAt(model, e.fqn)._ivalue().get())
              << e.fqn << " should be the model's own module";
          add_state_of(frontend::submoduleAt(model, e.fqn), e.fqn);
          break;
        case StageModuleEntry::Kind::kParameter:
        case StageModuleEntry::Kind::kBuffer:
          tensors.push_back(e.fqn);
          break;
        case StageModuleEntry::Kind::kAttribute:
          EXPECT_TRUE(stage.attr(e.fqn.substr(0, e.fqn.find('.'))).isModule());
          break;
      }
    }
    std::vector<std::string> held = built.manifest.stages[k].parameters;
    held.insert(held.end(), built.manifest.stages[k].buffers.begin(), built.manifest.stages[k].buffers.end());
    std::sort(held.begin(), held.end());
    std::sort(tensors.begin(), tensors.end());
    EXPECT_EQ(held, tensors);
  }
}

}  // namespace
}  // namespace pipeforge::stage
