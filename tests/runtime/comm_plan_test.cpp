#include "runtime/comm_plan.h"

#include <gtest/gtest.h>

namespace pipeforge::runtime {
namespace {

using stage::ValueSource;

ValueSource input(int i) { return ValueSource{ValueSource::Kind::kInput, -1, i}; }
ValueSource from(int stage, int i) { return ValueSource{ValueSource::Kind::kStage, stage, i}; }

// multi_io split in four: stage 0 makes `s`, read again by stage 2 (a skip);
// stage 2 makes `aux`, a model output the loss on stage 3 needs.
stage::PipeManifest skipManifest() {
  stage::PipeManifest m;
  m.num_stages = 4;
  m.inputs = {"x", "y", "mask"};
  auto add = [&](std::vector<ValueSource> inputs, int outputs) {
    stage::StageInfo s;
    s.index = static_cast<int>(m.stages.size());
    s.file = "stage_" + std::to_string(s.index) + ".pt";
    s.inputs = std::move(inputs);
    s.num_outputs = outputs;
    m.stages.push_back(s);
  };
  add({input(0)}, 1);                        // s
  add({from(0, 0), input(2), input(1)}, 1);  // h
  add({from(1, 0), from(0, 0)}, 2);          // hs, aux
  add({from(2, 0)}, 1);                      // out
  m.outputs = {from(3, 0), from(2, 1)};
  return m;
}

TEST(CommPlanTest, EveryStageOutputReadGetsItsOwnEdge) {
  CommPlan plan = buildCommPlan(skipManifest());
  ASSERT_EQ(plan.edges.size(), 5u);  // 0->1, 1->2, 0->2 (skip), 2->3, 2->3 (aux to the loss)
  EXPECT_EQ(plan.stages[0].consumers[0].size(), 2u);
  const Edge& skip = plan.edges[plan.stages[0].consumers[0][1]];
  EXPECT_EQ(skip.producer, 0);
  EXPECT_EQ(skip.consumer, 2);
  EXPECT_EQ(skip.consumer_slot, 1);
}

TEST(CommPlanTest, RootInputsAreReadLocally) {
  CommPlan plan = buildCommPlan(skipManifest());
  const StagePlan& s1 = plan.stages[1];
  ASSERT_EQ(s1.inputs.size(), 3u);
  EXPECT_EQ(s1.inputs[0].kind, StageInput::Kind::kEdge);
  EXPECT_EQ(s1.inputs[1].kind, StageInput::Kind::kRoot);
  EXPECT_EQ(s1.inputs[1].root_index, 2);
  EXPECT_EQ(s1.inputs[2].root_index, 1);
}

TEST(CommPlanTest, ModelOutputsFromEarlierStagesBecomeLossInputs) {
  CommPlan plan = buildCommPlan(skipManifest());
  const StagePlan& last = plan.stages[3];
  EXPECT_EQ(last.num_module_inputs, 1);
  ASSERT_EQ(last.inputs.size(), 2u);
  ASSERT_EQ(plan.model_outputs.size(), 2u);
  EXPECT_EQ(plan.model_outputs[0].kind, ModelOutput::Kind::kOwn);
  EXPECT_EQ(plan.model_outputs[1].kind, ModelOutput::Kind::kLossInput);
  EXPECT_EQ(plan.model_outputs[1].index, 1);
  const Edge& aux = plan.edges[last.inputs[1].edge];
  EXPECT_EQ(aux.producer, 2);
  EXPECT_EQ(aux.producer_output, 1);
}

TEST(CommPlanTest, RejectsAModelWithoutOutputs) {
  stage::PipeManifest m = skipManifest();
  m.outputs.clear();
  EXPECT_THROW(buildCommPlan(m), stage::ManifestError);
}

}  // namespace
}  // namespace pipeforge::runtime
