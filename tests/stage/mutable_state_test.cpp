// Lists, dicts and buffers changed in place across a cut: the chained stages
// compute what the model computes, forward after forward, or the split is
// refused with a message naming the op, the value and the modules (issue 12,
// Note [Mutable state across stages] in stage/stage_dataflow.cpp).
#include <gtest/gtest.h>

#include <torch/script.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "frontend/load_model.h"
#include "partitioner/split_spec.h"
#include "stage/run_chained.h"
#include "stage/split_in_memory.h"
#include "stage/split_model.h"
#include "tests/support/build_paths.h"
#include "tests/support/run_command.h"
#include "tests/support/zoo.h"

namespace pipeforge {
namespace {

struct MutableCase {
  std::string model;
  std::string spec_yaml;
  int expected_stages;
};

std::ostream& operator<<(std::ostream& os, const MutableCase& c) { return os << c.model << " | " << c.spec_yaml; }

double maxDiff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

std::map<std::string, at::Tensor> buffersOf(const torch::jit::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& b : m.named_buffers(/*recurse=*/true)) out[b.name] = b.value;
  return out;
}

// Runs the stages and a fresh copy of the model side by side, `forwards`
// times: every output equal, and afterwards every buffer a stage holds equal
// to the model's (a buffer the model changes in place lives in one stage).
void expectSameAsModelOver(const std::string& model_name, std::vector<torch::jit::Module>& stages,
                           const stage::PipeManifest& manifest, int forwards) {
  auto model = frontend::loadModel(testing::zooModelPath(model_name));
  auto ref = testing::loadReference(model_name);
  torch::NoGradGuard no_grad;
  for (int step = 0; step < forwards; ++step) {
    auto expected = testing::runForward(model, ref.inputs);
    if (step == 0) {
      ASSERT_EQ(expected.size(), ref.outputs.size());
      for (size_t i = 0; i < expected.size(); ++i) ASSERT_LE(maxDiff(expected[i], ref.outputs[i]), 1e-6);
    }
    auto outputs = stage::runChained(stages, manifest, ref.inputs);
    ASSERT_EQ(outputs.size(), expected.size());
    for (size_t i = 0; i < outputs.size(); ++i) {
      ASSERT_EQ(outputs[i].sizes(), expected[i].sizes()) << "forward " << step << " output " << i;
      EXPECT_LE(maxDiff(outputs[i], expected[i]), 1e-6) << "forward " << step << " output " << i;
    }
  }
  auto model_buffers = buffersOf(model);
  std::map<std::string, int> holders;
  for (size_t k = 0; k < stages.size(); ++k) {
    for (const auto& [name, value] : buffersOf(stages[k])) {
      ++holders[name];
      ASSERT_TRUE(model_buffers.count(name)) << name;
      EXPECT_TRUE(torch::equal(value, model_buffers[name])) << "stage " << k << " buffer " << name;
    }
  }
  for (const auto& [name, count] : holders) EXPECT_EQ(count, 1) << name << " is held by " << count << " stages";
}

class MutableStateSplit : public ::testing::TestWithParam<MutableCase> {};

TEST_P(MutableStateSplit, ChainedStagesMatchTheModelForwardAfterForward) {
  const MutableCase& c = GetParam();
  auto model = frontend::loadModel(testing::zooModelPath(c.model));
  auto result = stage::splitInMemory(model, partitioner::parseSplitSpec(c.spec_yaml, "test spec"));
  ASSERT_EQ(result.partition.num_stages, c.expected_stages);
  for (auto& m : result.stages.modules) m.eval();
  expectSameAsModelOver(c.model, result.stages.modules, result.stages.manifest, /*forwards=*/3);
}

const std::vector<MutableCase> kCarried = {
    // A list appended to on both sides of a cut; all appends before the cut; six stages.
    {"list_across_cut", "split_points: {blocks.2: BEGINNING}", 2},
    {"list_across_cut", "split_points: {head: BEGINNING}", 2},
    {"list_across_cut", "split_points: {blocks.1: BEGINNING, blocks.3: BEGINNING}", 3},
    {"list_across_cut", "split_points: {blocks.0: BEGINNING, blocks.1: BEGINNING, blocks.2: BEGINNING, "
                        "blocks.3: BEGINNING, head: BEGINNING}",
     6},
    // Made in stage 0, grown (append, insert, pop) in stage 1, read in stage 2.
    {"list_grown_later", "split_points: {b: BEGINNING, d: BEGINNING}", 3},
    {"list_grown_later", "split_points: {b: BEGINNING}", 2},
    {"list_grown_later", "split_points: {c: BEGINNING, d: BEGINNING}", 3},
    // Dict items set, overwritten and read across cuts.
    {"dict_across_cut", "split_points: {b: BEGINNING}", 2},
    {"dict_across_cut", "split_points: {b: BEGINNING, c: BEGINNING}", 3},
    // A buffer counter changed in stage 0 and read in stage 1, 2; changed and read in one stage.
    {"buffer_across_cut", "split_points: {body: BEGINNING}", 2},
    {"buffer_across_cut", "split_points: {body: BEGINNING, head: BEGINNING}", 3},
    {"buffer_within_stage", "split_points: {body: BEGINNING}", 2},
    {"buffer_within_stage", "split_points: {body: BEGINNING, head: BEGINNING}", 3},
};

INSTANTIATE_TEST_SUITE_P(Carried, MutableStateSplit, ::testing::ValuesIn(kCarried));

int inputsFrom(const stage::StageInfo& info, int stage) {
  int n = 0;
  for (const auto& in : info.inputs) n += in.kind == stage::ValueSource::Kind::kStage && in.stage == stage;
  return n;
}

TEST(MutableState, ListTravelsAsItsTensors) {
  // `head: BEGINNING`: stage 0 appends all four features; stage 1 reads `h`
  // and the list, so it receives `h` and the list's four tensors.
  auto model = frontend::loadModel(testing::zooModelPath("list_across_cut"));
  auto result = stage::splitInMemory(model, partitioner::parseSplitSpec("split_points: {head: BEGINNING}", "t"));
  const auto& m = result.stages.manifest;
  EXPECT_EQ(m.stages[0].num_outputs, 5);
  EXPECT_EQ(inputsFrom(m.stages[1], 0), 5);
}

TEST(MutableState, BufferGoesToTheReaderWhichHoldsNoCopy) {
  auto model = frontend::loadModel(testing::zooModelPath("buffer_across_cut"));
  auto result = stage::splitInMemory(model, partitioner::parseSplitSpec("split_points: {body: BEGINNING}", "t"));
  const auto& m = result.stages.manifest;
  EXPECT_EQ(m.stages[0].buffers, (std::vector<std::string>{"counter.count"}));
  EXPECT_TRUE(m.stages[1].buffers.empty());
  EXPECT_EQ(inputsFrom(m.stages[1], 0), 2) << "the activation and counter.count";
  EXPECT_TRUE(m.tied.empty());
}

TEST(MutableState, SavedStagesLoadAndMatch) {
  std::string dir = testing::makeTempDir("pf-mutable");
  for (const auto& [model, spec] : std::vector<std::pair<std::string, std::string>>{
           {"list_grown_later", "split_points:\n  b: BEGINNING\n  d: BEGINNING\n"},
           {"dict_across_cut", "split_points:\n  b: BEGINNING\n"},
           {"buffer_across_cut", "split_points:\n  body: BEGINNING\n"}}) {
    SCOPED_TRACE(model);
    std::string spec_path = dir + "/" + model + ".yaml";
    std::ofstream(spec_path) << spec;
    stage::SplitRequest request;
    request.model_path = testing::zooModelPath(model);
    request.spec_path = spec_path;
    request.out_dir = dir + "/" + model;
    stage::splitModelToDirectory(request);
    auto manifest = stage::readManifest(request.out_dir);
    std::vector<torch::jit::Module> stages;
    for (const auto& s : manifest.stages) stages.push_back(torch::jit::load(request.out_dir + "/" + s.file));
    expectSameAsModelOver(model, stages, manifest, /*forwards=*/2);
  }
  std::filesystem::remove_all(dir);
}

// Splitting runs the stages on example_inputs (shapes in pipe.json; the cost
// policy's timings). That must not advance the counter the stages then save.
TEST(MutableState, ExampleInputsLeaveTheSavedStateAsTheModelHasIt) {
  std::string dir = testing::makeTempDir("pf-mutable-examples");
  for (const char* spec : {"split_points: {body: BEGINNING}\nexample_inputs:\n  - {shape: [2, 4]}\n",
                           "num_stages: 2\npolicy: cost\nexample_inputs:\n  - {shape: [2, 4]}\n"}) {
    SCOPED_TRACE(spec);
    std::filesystem::remove_all(dir + "/out");
    std::ofstream(dir + "/spec.yaml") << spec;
    stage::SplitRequest request;
    request.model_path = testing::zooModelPath("buffer_across_cut");
    request.spec_path = dir + "/spec.yaml";
    request.out_dir = dir + "/out";
    stage::splitModelToDirectory(request);
    auto manifest = stage::readManifest(request.out_dir);
    std::vector<torch::jit::Module> stages;
    for (const auto& s : manifest.stages) stages.push_back(torch::jit::load(request.out_dir + "/" + s.file));
    auto held = buffersOf(stages[0]);
    ASSERT_TRUE(held.count("counter.count"));
    EXPECT_EQ(held["counter.count"].item<double>(), 0.0) << "the model was saved with count 0";
    expectSameAsModelOver("buffer_across_cut", stages, manifest, /*forwards=*/2);
  }
  std::filesystem::remove_all(dir);
}

TEST(MutableState, GradientsThroughACarriedListMatchTheModel) {
  for (const char* spec : {"split_points: {blocks.2: BEGINNING}", "split_points: {head: BEGINNING}"}) {
    SCOPED_TRACE(spec);
    auto model = frontend::loadModel(testing::zooModelPath("list_across_cut"));
    auto result = stage::splitInMemory(model, partitioner::parseSplitSpec(spec, "t"));
    auto ref = testing::loadReference("list_across_cut");
    stage::runChained(result.stages.modules, result.stages.manifest, ref.inputs)[0].sum().backward();
    auto original = frontend::loadModel(testing::zooModelPath("list_across_cut"));
    original.forward(ref.inputs).toTensor().sum().backward();
    std::map<std::string, at::Tensor> expected;
    for (const auto& p : original.named_parameters(true)) expected[p.name] = p.value.grad();
    size_t seen = 0;
    for (auto& m : result.stages.modules) {
      for (const auto& p : m.named_parameters(true)) {
        ASSERT_TRUE(p.value.grad().defined()) << p.name;
        EXPECT_LE(maxDiff(p.value.grad(), expected.at(p.name)), 1e-6) << p.name;
        ++seen;
      }
    }
    EXPECT_EQ(seen, expected.size());
  }
}

struct RefusedCase {
  std::string model;
  std::string spec_yaml;
  std::vector<std::string> fragments;  // each must be in the message
};

std::ostream& operator<<(std::ostream& os, const RefusedCase& c) { return os << c.model << " | " << c.spec_yaml; }

const std::vector<RefusedCase> kRefused = {
    // Read in stage 0, changed in stage 1: the next forward of stage 0 would need the new value.
    {"buffer_read_before_write",
     "split_points: {body: BEGINNING}",
     {"buffer `counter.count`", "aten::add_", "`counter`", "stage 1", "read in stage 0", "move the split"}},
    // One BatchNorm called by two stages: each would update its own running statistics.
    {"shared_norm", "split_points: {b: BEGINNING}", {"`norm.", "stage 0", "stage 1", "move the split"}},
    // A list appended to in a loop: its length is not known when splitting.
    {"list_in_loop", "split_points: {b: BEGINNING}", {"%rows", "prim::Loop", "length", "stage 1", "move the split"}},
};

class MutableStateRefused : public ::testing::TestWithParam<RefusedCase> {};

TEST_P(MutableStateRefused, SplitFailsNamingTheStateAndTheFix) {
  const RefusedCase& c = GetParam();
  auto model = frontend::loadModel(testing::zooModelPath(c.model));
  try {
    stage::splitInMemory(model, partitioner::parseSplitSpec(c.spec_yaml, "test spec"));
    FAIL() << "the split should have been refused";
  } catch (const stage::StageBuildError& e) {
    std::string message = e.what();
    for (const auto& fragment : c.fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos) << "missing '" << fragment << "' in:\n" << message;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Zoo, MutableStateRefused, ::testing::ValuesIn(kRefused));

TEST(MutableState, CliExitsWithOneAndLeavesNoFolder) {
  std::string dir = testing::makeTempDir("pf-mutable-cli");
  std::string spec = dir + "/spec.yaml";
  std::ofstream(spec) << "split_points:\n  body: BEGINNING\n";
  std::string out = dir + "/out";
  auto result = testing::runCommand(std::string(PIPEFORGE_BINARY) + " split '" +
                                    testing::zooModelPath("buffer_read_before_write") + "' --spec '" + spec +
                                    "' --out '" + out + "'");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("counter.count"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("terminate called"), std::string::npos) << result.output;
  EXPECT_FALSE(std::filesystem::exists(out));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace pipeforge
