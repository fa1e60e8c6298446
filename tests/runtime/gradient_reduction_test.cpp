// GradientReducer on in-process ranks (FakeWorld threads): the exact
// averages and sums it leaves in each rank's gradients.
#include "runtime/gradient_reduction.h"

#include <gtest/gtest.h>
#include <torch/script.h>

#include <map>

#include "runtime/fake_comm.h"
#include "runtime/step_trace.h"
#include "tests/runtime/runner_fixture.h"

namespace pipeforge::runtime {
namespace {

using NamedParameters = std::vector<std::pair<std::string, at::Tensor>>;

at::Tensor param(std::vector<float> values) { return torch::tensor(values).requires_grad_(true); }
at::Tensor withGrad(at::Tensor p, std::vector<float> grad) {
  p.mutable_grad() = torch::tensor(grad);
  return p;
}
at::Tensor values(std::vector<float> v) { return torch::tensor(v); }

// Each rank's local stages, by stage index.
GradientReducer::ParametersOf parametersOf(std::map<int, NamedParameters>& stages) {
  return [&stages](int s) { return stages.at(s); };
}

TEST(GradientReducerTest, ReplicasAverageEveryGradientOfAStage) {
  auto results = onThreads(2, [](int rank, std::shared_ptr<Communicator> comm) {
    std::map<int, NamedParameters> stages;
    stages[0] = {{"w", withGrad(param({0, 0}), rank == 0 ? std::vector<float>{1, 2} : std::vector<float>{3, 8})},
                 {"b", rank == 0 ? param({0, 0}) : withGrad(param({0, 0}), {4, 6})},  // none on rank 0: zeros
                 {"frozen", withGrad(torch::zeros({2}), {5, 5})}};                    // no requires_grad: untouched
    GradientReducer reducer(*comm, GradientReductionConfig{2, {0, 1}, {}}, parametersOf(stages));
    StepTrace trace;
    reducer.beginStep();
    reducer.reduceStage(0, trace);
    return stages;
  });
  for (int rank = 0; rank < 2; ++rank) {
    const NamedParameters& p = results[rank].at(0);
    EXPECT_TRUE(torch::equal(p[0].second.grad(), values({2, 5}))) << rank;
    EXPECT_TRUE(torch::equal(p[1].second.grad(), values({2, 3}))) << rank;
    EXPECT_TRUE(torch::equal(p[2].second.grad(), values({5, 5}))) << rank;
  }
}

TEST(GradientReducerTest, AStageIsReducedOncePerStep) {
  auto results = onThreads(2, [](int rank, std::shared_ptr<Communicator> comm) {
    std::map<int, NamedParameters> stages;
    stages[0] = {{"w", withGrad(param({0}), {rank == 0 ? 2.0f : 4.0f})}};
    GradientReducer reducer(*comm, GradientReductionConfig{2, {0, 1}, {}}, parametersOf(stages));
    StepTrace trace;
    reducer.beginStep();
    reducer.reduceStage(0, trace);                      // REDUCE_GRAD
    stages[0][0].second.mutable_grad().fill_(rank);     // a change no second reduction may see
    reducer.reduceStage(0, trace);                      // the step's end: done already
    at::Tensor after_first_step = stages[0][0].second.grad().clone();
    reducer.beginStep();
    reducer.reduceStage(0, trace);                      // the next step reduces again: (0 + 1) / 2
    return std::make_pair(after_first_step, stages[0][0].second.grad().clone());
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(torch::equal(results[rank].first, values({static_cast<float>(rank)}))) << rank;
    EXPECT_TRUE(torch::equal(results[rank].second, values({0.5f}))) << rank;
  }
}

TEST(GradientReducerTest, WithoutDataParallelismNothingChanges) {
  FakeWorld world(1, std::chrono::seconds(20));
  auto comm = world.communicator(0);
  std::map<int, NamedParameters> stages;
  stages[0] = {{"w", param({1})}};
  GradientReducer reducer(*comm, GradientReductionConfig{1, {0}, {}}, parametersOf(stages));
  StepTrace trace;
  reducer.beginStep();
  reducer.reduceStage(0, trace);
  EXPECT_FALSE(stages[0][0].second.grad().defined());
}

TEST(GradientReducerTest, TiedHoldersOnOneRankGetTheirSum) {
  FakeWorld world(1, std::chrono::seconds(20));
  auto comm = world.communicator(0);
  std::map<int, NamedParameters> stages;
  stages[0] = {{"emb.weight", withGrad(param({0, 0}), {1, 2})}, {"other", withGrad(param({0}), {7})}};
  stages[1] = {{"head.weight", withGrad(param({0, 0}), {10, 20})}};
  TiedGroup tied{{{0, "emb.weight"}, {1, "head.weight"}}, {0}, /*crosses_stages=*/true};
  GradientReducer reducer(*comm, GradientReductionConfig{1, {0}, {tied}}, parametersOf(stages));
  StepProfile profile;
  StepTrace trace;
  trace.begin(&profile, StepClock::now());
  reducer.sumTied(trace);
  EXPECT_TRUE(torch::equal(stages[0][0].second.grad(), values({11, 22})));
  EXPECT_TRUE(torch::equal(stages[1][0].second.grad(), values({11, 22})));
  EXPECT_TRUE(torch::equal(stages[0][1].second.grad(), values({7})));
  EXPECT_TRUE(profile.spans.empty());  // no collective on one rank
}

TEST(GradientReducerTest, TiedHoldersAcrossRanksGetTheSumOverAll) {
  auto results = onThreads(2, [](int rank, std::shared_ptr<Communicator> comm) {
    std::map<int, NamedParameters> stages;
    TiedGroup tied;
    tied.ranks = {0, 1};
    tied.crosses_stages = true;
    if (rank == 0) {
      stages[0] = {{"emb.weight", withGrad(param({0, 0}), {1, 2})}};
      tied.local = {{0, "emb.weight"}};
    } else {
      stages[1] = {{"head.weight", param({0, 0})}};  // no gradient: contributes zeros
      stages[2] = {{"out.weight", withGrad(param({0, 0}), {30, 40})}};
      tied.local = {{1, "head.weight"}, {2, "out.weight"}};
    }
    GradientReducer reducer(*comm, GradientReductionConfig{1, {rank}, {tied}}, parametersOf(stages));
    StepProfile profile;
    StepTrace trace;
    trace.begin(&profile, StepClock::now());
    reducer.sumTied(trace);
    return std::make_pair(stages, profile);
  });
  EXPECT_TRUE(torch::equal(results[0].first.at(0)[0].second.grad(), values({31, 42})));
  EXPECT_TRUE(torch::equal(results[1].first.at(1)[0].second.grad(), values({31, 42})));
  EXPECT_TRUE(torch::equal(results[1].first.at(2)[0].second.grad(), values({31, 42})));
  ASSERT_EQ(results[1].second.spans.size(), 1u);
  EXPECT_EQ(results[1].second.spans[0].kind, SpanKind::kAllReduce);
  EXPECT_EQ(results[1].second.spans[0].name, "all-reduce tied grads head.weight");
}

TEST(GradientReducerTest, AProfiledReductionIsASpan) {
  auto results = onThreads(2, [](int, std::shared_ptr<Communicator> comm) {
    std::map<int, NamedParameters> stages;
    stages[3] = {{"w", withGrad(param({0}), {1})}};
    GradientReducer reducer(*comm, GradientReductionConfig{2, {0, 1}, {}}, parametersOf(stages));
    StepProfile profile;
    StepTrace trace;
    trace.begin(&profile, StepClock::now());
    reducer.beginStep();
    reducer.reduceStage(3, trace);
    return profile;
  });
  ASSERT_EQ(results[0].spans.size(), 1u);
  EXPECT_EQ(results[0].spans[0].kind, SpanKind::kAllReduce);
  EXPECT_EQ(results[0].spans[0].name, "all-reduce grads stage 3 over 2 replicas");
  EXPECT_LE(results[0].spans[0].start_s, results[0].spans[0].end_s);
}

}  // namespace
}  // namespace pipeforge::runtime
