// PipelineStage: on every zoo stage I then W gives exactly B's gradients,
// a missing stage file is reported, and a stage cut for every_n
// checkpointing is checked.
#include "runtime/pipeline_stage.h"

#include <gtest/gtest.h>
#include <torch/script.h>

#include "runtime/comm_plan.h"
#include "runtime/errors.h"
#include "stage/manifest.h"
#include "tests/runtime/grad_check.h"
#include "tests/support/script_module.h"

namespace pipeforge::runtime {
namespace {

// Runs every stage of a split in order on one microbatch, checking I+W == B.
void checkSplit(const std::string& model, int stages) {
  std::string dir = testing::splitsRoot() + "/" + model + "_" + std::to_string(stages);
  stage::PipeManifest manifest = stage::readManifest(dir);
  CommPlan plan = buildCommPlan(manifest);
  torch::manual_seed(3);
  std::vector<at::Tensor> roots;
  if (model == "gpt") roots = {torch::randint(0, 64, {2, 16})};
  if (model == "mlp") roots = {torch::randn({2, 8})};
  if (model == "multi_io") roots = {torch::randn({2, 8}), torch::randn({2, 8}), torch::randint(0, 2, {2, 8})};

  std::vector<std::vector<at::Tensor>> outputs(stages);
  for (int s = 0; s < stages; ++s) {
    SCOPED_TRACE(model + " stage " + std::to_string(s));
    PipelineStage stage = PipelineStage::fromSplit(dir, manifest, plan, s, "cpu");
    std::vector<at::Tensor> inputs;
    for (const StageInput& in : plan.stages[s].inputs) {
      if (in.kind == StageInput::Kind::kRoot) {
        inputs.push_back(roots[in.root_index]);
      } else {
        const Edge& e = plan.edges[in.edge];
        inputs.push_back(outputs[e.producer][e.producer_output]);
      }
    }
    auto run = [&](bool split) {
      std::vector<at::Tensor> outs = stage.forward(0, inputs, true);
      std::vector<at::Tensor> gy;
      torch::manual_seed(4);
      for (const auto& o : outs) gy.push_back(torch::randn_like(o));
      std::vector<at::Tensor> gx;
      if (split) {
        gx = stage.backwardInput(0, gy);
        stage.backwardWeight(0);
      } else {
        gx = stage.backward(0, gy);
      }
      std::vector<at::Tensor> gp;
      for (auto& [name, p] : stage.namedParameters()) gp.push_back(p.grad().clone());
      stage.zeroGrad();
      EXPECT_EQ(stage.liveMicrobatches(), 0);
      return std::make_pair(gx, gp);
    };
    auto [bx, bp] = run(false);
    auto [ix, ip] = run(true);
    ASSERT_EQ(bx.size(), inputs.size());
    for (std::size_t j = 0; j < inputs.size(); ++j) {
      // Loss inputs (after the module's) reach only the loss, which this test does not compute.
      bool wants = plan.stages[s].inputs[j].kind == StageInput::Kind::kEdge && inputs[j].is_floating_point() &&
                   static_cast<int>(j) < plan.stages[s].num_module_inputs;
      EXPECT_EQ(bx[j].defined(), wants) << "input " << j;
      EXPECT_EQ(ix[j].defined(), wants) << "input " << j;
      if (wants) EXPECT_TRUE(torch::allclose(bx[j], ix[j], 1e-6, 1e-7)) << "input " << j;
    }
    for (std::size_t k = 0; k < bp.size(); ++k) EXPECT_TRUE(torch::allclose(bp[k], ip[k], 1e-6, 1e-7)) << "param " << k;
    torch::NoGradGuard no_grad;
    outputs[s] = stage.forward(0, inputs, false);
  }
}

TEST(PipelineStageTest, SplitBackwardMatchesFullOnEveryZooStage) {
  checkSplit("mlp", 4);
  checkSplit("gpt", 4);
  checkSplit("gpt", 8);
  checkSplit("multi_io", 8);
}

TEST(PipelineStageTest, ReportsAMissingStageFile) {
  stage::PipeManifest manifest = stage::readManifest(testing::splitsRoot() + "/mlp_2");
  CommPlan plan = buildCommPlan(manifest);
  try {
    PipelineStage::fromSplit("/nonexistent", manifest, plan, 0, "cpu");
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot load '/nonexistent/stage_0.pt'"), std::string::npos) << e.what();
  }
}

// Note [Checkpointing every k-th call]: the runtime cuts a stage with the
// StageCutter it is given, and checks what it gets back.
PipelineStage affineStage() {
  StageSignature sig;
  sig.num_module_inputs = 1;
  sig.num_outputs = 1;
  sig.input_wants_grad = {true};
  return PipelineStage(testing::affine("A", 2), sig);
}

TEST(PipelineStageTest, CheckpointingEveryNWithoutACutterIsABug) {
  PipelineStage stage = affineStage();
  try {
    stage.setActivationCheckpointing(true, 2);
    FAIL() << "no error";
  } catch (const pipeforge::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
    EXPECT_NE(std::string(e.what()).find(
                  "stage 0: checkpointing every 2 calls needs a StageCutter (stage::cutAtCalls); none was given"),
              std::string::npos)
        << e.what();
  }
}

TEST(PipelineStageTest, ACutThatFailsSaysToCheckpointTheWholeStage) {
  PipelineStage stage = affineStage();
  StageCutter failing = [](const torch::jit::Module&, int, std::vector<torch::jit::Module>&) -> stage::StageSegments {
    throw std::runtime_error("no calls to cut at");
  };
  try {
    stage.setActivationCheckpointing(true, 3, failing);
    FAIL() << "no error";
  } catch (const RuntimeError& e) {
    EXPECT_STREQ(e.what(), "stage 0: pipeline.activation_checkpointing.every_n 3 needs the stage cut at its submodule "
                           "calls, and that failed: no calls to cut at; use activation_checkpointing: full (the "
                           "whole stage is recomputed) instead");
  }
}

TEST(PipelineStageTest, SegmentsThatCopyTheStagesTensorsAreRefused) {
  PipelineStage stage = affineStage();
  StageCutter copying = [](const torch::jit::Module& module, int, std::vector<torch::jit::Module>& segments) {
    segments = {module.deepcopy()};
    stage::StageSegments out;
    out.checkpointed = {true};
    out.calls = {"(no calls)"};
    return out;
  };
  try {
    stage.setActivationCheckpointing(true, 1, copying);
    FAIL() << "no error";
  } catch (const pipeforge::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
    EXPECT_NE(std::string(e.what()).find("stage 0: segment 0 holds its own copy of 'weight'; segments must share "
                                         "the stage's tensors"),
              std::string::npos)
        << e.what();
  }
}

TEST(PipelineStageTest, FewerCallsThanKLeaveTheStageWhole) {
  PipelineStage stage = affineStage();
  StageCutter nothing_to_cut = [](const torch::jit::Module&, int, std::vector<torch::jit::Module>& segments) {
    segments.clear();
    return stage::StageSegments{};
  };
  stage.setActivationCheckpointing(true, 8, nothing_to_cut);
  EXPECT_TRUE(stage.recomputedCalls().empty());
}

}  // namespace
}  // namespace pipeforge::runtime
