// EdgeMessenger between two in-process ranks (FakeWorld threads): what
// arrives, which messages travel (as the trace names them), and the errors.
#include "runtime/edge_messenger.h"

#include <gtest/gtest.h>
#include <torch/script.h>

#include "runtime/comm_plan.h"
#include "runtime/errors.h"
#include "runtime/fake_comm.h"
#include "runtime/step_trace.h"
#include "tests/runtime/runner_fixture.h"

namespace pipeforge::runtime {
namespace {

// Stage 0 on rank 0 sends its one output to stage 1 on rank 1: edge 0.
CommPlan twoStages() {
  CommPlan plan;
  plan.num_stages = 2;
  plan.num_model_inputs = 1;
  StagePlan first;
  first.inputs = {StageInput{StageInput::Kind::kRoot, 0, -1}};
  first.num_module_inputs = 1;
  first.num_outputs = 1;
  first.consumers = {{0}};
  StagePlan second;
  second.inputs = {StageInput{StageInput::Kind::kEdge, -1, 0}};
  second.num_module_inputs = 1;
  second.num_outputs = 1;
  second.consumers = {{}};
  plan.stages = {first, second};
  plan.edges = {Edge{0, 0, 0, 1, 0}};
  return plan;
}

EdgeMessengerConfig configOf(const CommPlan& plan, int rank, ShapeMode shapes) {
  EdgeMessengerConfig c;
  c.plan = &plan;
  c.rank = rank;
  c.edge_src = {0};
  c.edge_dst = {1};
  c.shapes = shapes;
  return c;
}

std::vector<std::string> spanNames(const StepProfile& profile) {
  std::vector<std::string> out;
  for (const TimedSpan& s : profile.spans) out.push_back(s.name);
  return out;
}

using Names = std::vector<std::string>;

TEST(EdgeMessengerTest, AValueIsDescribedOnceThenSentAloneAndItsGradientComesBack) {
  const CommPlan plan = twoStages();
  const at::Tensor value = torch::arange(6, torch::kFloat).reshape({2, 3});
  auto results = onThreads(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    EdgeMessenger messenger(*comm, configOf(plan, rank, ShapeMode::kInferOnce));
    std::vector<Names> spans;
    at::Tensor received, grad;
    for (int step = 0; step < 2; ++step) {
      StepProfile profile;
      StepTrace trace;
      trace.begin(&profile, StepClock::now());
      messenger.beginStep(1, {2, 3}, trace);
      if (rank == 0) {
        messenger.sendValue(0, 0, value);
        grad = messenger.waitGradRecv(0, 0, TensorMeta{{2, 3}, at::kFloat});
      } else {
        received = messenger.waitValueRecv(0, 0);
        messenger.sendGrad(0, 0, received * 2);
      }
      messenger.finishStep();
      messenger.clearStep();
      spans.push_back(spanNames(profile));
    }
    return std::make_tuple(spans, received, grad);
  });
  const auto& [sender_spans, unused, grad] = results[0];
  const auto& [receiver_spans, received, unused_grad] = results[1];
  EXPECT_TRUE(torch::equal(received, value));
  EXPECT_TRUE(torch::equal(grad, value * 2));
  EXPECT_EQ(sender_spans[0], (Names{"send 0F0 shape to rank 1", "send 0F0 to rank 1", "wait recv 0B0 from rank 1",
                                    "wait send 0F0 shape to rank 1", "wait send 0F0 to rank 1"}));
  EXPECT_EQ(receiver_spans[0], (Names{"wait recv 1F0 shape from rank 0", "wait recv 1F0 from rank 0",
                                      "send 1B0 to rank 0", "wait send 1B0 to rank 0"}));
  // The same batch shapes on the next step: no shape message.
  EXPECT_EQ(sender_spans[1], (Names{"send 0F0 to rank 1", "wait recv 0B0 from rank 1", "wait send 0F0 to rank 1"}));
  EXPECT_EQ(receiver_spans[1], (Names{"wait recv 1F0 from rank 0", "send 1B0 to rank 0", "wait send 1B0 to rank 0"}));
}

// Under NCCL (Note [NCCL order]) a value whose shape the receiver learns is
// two ops, posted back to back. Receives of two microbatches posted ahead
// would put the second shape message where the sender has the first value;
// with the pair order (Note [Pair order]) the messenger posts the first
// value's receive before the second shape message.
TEST(EdgeMessengerTest, ReceivesPostedAheadFollowThePairOrderUnderNccl) {
  const CommPlan plan = twoStages();
  const at::Tensor v0 = torch::ones({2, 3}), v1 = torch::full({2, 3}, 2.0f);
  for (bool with_order : {false, true}) {
    auto results = onThreads(
        2,
        [&](int rank, std::shared_ptr<Communicator> comm) -> std::string {
          EdgeMessengerConfig c = configOf(plan, rank, ShapeMode::kInferOnce);
          if (with_order) {
            c.pair_order[1 - rank] = {PairMessage{0, 0, MessageKind::kValue}, PairMessage{0, 1, MessageKind::kValue}};
          }
          EdgeMessenger messenger(*comm, c);
          StepTrace trace;
          messenger.beginStep(2, {2, 3}, trace, /*train=*/false);
          try {
            if (rank == 0) {
              messenger.sendValue(0, 0, v0);
              messenger.sendValue(0, 1, v1);
              messenger.finishStep();
              return "sent";
            }
            messenger.postValueRecv(0, 0);
            messenger.postValueRecv(0, 1);
            const at::Tensor got0 = messenger.waitValueRecv(0, 0);
            const at::Tensor got1 = messenger.waitValueRecv(0, 1);
            messenger.finishStep();
            return torch::equal(got0, v0) && torch::equal(got1, v1) ? "received" : "wrong values";
          } catch (const std::exception& e) {
            comm->abort(e.what());
            messenger.abandonStep();
            return e.what();
          }
        },
        Matching::kNcclOrder);
    if (with_order) {
      EXPECT_EQ(results[0], "sent");
      EXPECT_EQ(results[1], "received");
      continue;
    }
    EXPECT_EQ(results[1],
              "NCCL order: mismatch between rank 0 and rank 1 at op #1 of their pair: rank 0 posted send tag 0 [2,3] "
              "Float to rank 1, rank 1 posted recv tag 5 [12] Long from rank 0; NCCL pairs ops by their order, so the "
              "receive would get the wrong data (tags, shapes, dtypes differ)");
  }
}

TEST(EdgeMessengerTest, AStaticShapeThatDiffersIsRefusedBeforeSending) {
  const CommPlan plan = twoStages();
  FakeWorld world(2, std::chrono::seconds(20));
  auto comm = world.communicator(0);
  EdgeMessengerConfig c = configOf(plan, 0, ShapeMode::kStatic);
  c.static_shapes = {{}, {TensorMeta{{2, 4}, at::kFloat}}};
  EdgeMessenger messenger(*comm, c);
  StepTrace trace;
  messenger.beginStep(1, {2}, trace);
  try {
    messenger.sendValue(0, 0, torch::zeros({2, 3}));
    FAIL() << "expected RuntimeError";
  } catch (const RuntimeError& e) {
    EXPECT_STREQ(e.what(), "stage 0 output 0 is [2,3] Float but static_shapes says [2,4] Float for stage 1; fix "
                           "static_shapes or use ShapeMode::kInferOnce");
  }
  messenger.finishStep();  // nothing was sent
}

TEST(EdgeMessengerTest, AShapeThatChangesUnderTheSameBatchShapesIsRefused) {
  const CommPlan plan = twoStages();
  FakeWorld world(2, std::chrono::seconds(20));
  auto comm = world.communicator(0);
  EdgeMessenger messenger(*comm, configOf(plan, 0, ShapeMode::kInferOnce));
  StepTrace trace;
  messenger.beginStep(1, {2}, trace);
  messenger.sendValue(0, 0, torch::zeros({2, 3}));
  messenger.finishStep();  // the fake's sends finish at once
  messenger.beginStep(1, {2}, trace);
  try {
    messenger.sendValue(0, 0, torch::zeros({2, 5}));
    FAIL() << "expected RuntimeError";
  } catch (const RuntimeError& e) {
    EXPECT_STREQ(e.what(), "stage 0 output 0 for microbatch 0 is [2,5] Float but was [2,3] Float on an earlier step "
                           "with the same batch shapes; for shapes that vary use ShapeMode::kPerStep");
  }
}

TEST(EdgeMessengerTest, AReceivePostedButNeverUsedIsABug) {
  const CommPlan plan = twoStages();
  FakeWorld world(2, std::chrono::seconds(20));
  auto comm = world.communicator(1);
  EdgeMessenger messenger(*comm, configOf(plan, 1, ShapeMode::kInferOnce));
  StepTrace trace;
  messenger.beginStep(1, {2}, trace);
  messenger.postValueRecv(0, 0);
  try {
    messenger.finishStep();
    FAIL() << "expected an error";
  } catch (const pipeforge::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
    EXPECT_NE(std::string(e.what()).find("rank 1: a receive on edge 0 microbatch 0 was posted but never used"),
              std::string::npos)
        << e.what();
  }
  comm->abort("test over");  // an op never waited may be destroyed only then
  messenger.clearStep();
}

}  // namespace
}  // namespace pipeforge::runtime
