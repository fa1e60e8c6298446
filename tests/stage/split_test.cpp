// Chained stages compute what the model computes, and keep its parameter names.
#include <gtest/gtest.h>

#include <torch/script.h>

#include <filesystem>
#include <map>
#include <set>

#include "frontend/load_model.h"
#include "partitioner/split_spec.h"
#include "stage/manifest.h"
#include "stage/run_chained.h"
#include "stage/split_in_memory.h"
#include "stage/split_model.h"
#include "tests/support/zoo.h"

namespace pipeforge {
namespace {

struct SplitCase {
  std::string model;
  std::string spec_yaml;
  int expected_stages;  // 0: don't check
};

std::ostream& operator<<(std::ostream& os, const SplitCase& c) { return os << c.model << " | " << c.spec_yaml; }

std::map<std::string, at::Tensor> stateDict(const torch::jit::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m.named_parameters(true)) out[p.name] = p.value;
  for (const auto& b : m.named_buffers(true)) out[b.name] = b.value;
  return out;
}

void expectSplitMatchesModel(const SplitCase& c, std::vector<torch::jit::Module>& modules,
                             const stage::PipeManifest& manifest) {
  auto model = frontend::loadModel(testing::zooModelPath(c.model));
  auto ref = testing::loadReference(c.model);
  for (auto& m : modules) m.eval();
  torch::NoGradGuard no_grad;
  auto outputs = stage::runChained(modules, manifest, ref.inputs);
  ASSERT_EQ(outputs.size(), ref.outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    ASSERT_EQ(outputs[i].sizes(), ref.outputs[i].sizes()) << "output " << i;
    double diff = (outputs[i] - ref.outputs[i]).abs().max().item<double>();
    EXPECT_LE(diff, 1e-6) << "output " << i;
  }
  // Names and values come from the original state_dict; every key is somewhere.
  auto original = stateDict(model);
  std::set<std::string> covered;
  for (size_t k = 0; k < modules.size(); ++k) {
    ASSERT_FALSE(manifest.stages[k].parameters.empty() && manifest.stages[k].buffers.empty() &&
                 c.model != "markers")
        << "stage " << k << " holds nothing";
    for (const auto& [name, tensor] : stateDict(modules[k])) {
      ASSERT_TRUE(original.count(name)) << "stage " << k << " has '" << name << "', not an original key";
      EXPECT_TRUE(torch::equal(tensor, original[name])) << name;
      covered.insert(name);
    }
  }
  for (const auto& [name, tensor] : original) EXPECT_TRUE(covered.count(name)) << name << " is in no stage";
}

class SplitZoo : public ::testing::TestWithParam<SplitCase> {};

TEST_P(SplitZoo, ChainedStagesReproduceTheModel) {
  const SplitCase& c = GetParam();
  auto model = frontend::loadModel(testing::zooModelPath(c.model));
  auto spec = partitioner::parseSplitSpec(c.spec_yaml, "test spec");
  auto result = stage::splitInMemory(model, spec);
  if (c.expected_stages) EXPECT_EQ(result.partition.num_stages, c.expected_stages);
  expectSplitMatchesModel(c, result.stages.modules, result.stages.manifest);
}

const std::vector<SplitCase> kExplicitCases = {
    {"seed_example", "split_points: {layers.1: BEGINNING}", 2},
    {"seed_example", "split_points: {layers.0: END}", 2},
    {"seed_example", "split_points: {layers.1.lin: BEGINNING, lm.proj: BEGINNING}", 3},
    {"mlp", "split_points: {blocks.2: BEGINNING}", 2},
    {"mlp", "split_points: {blocks.2: END, blocks.4.fc2: BEGINNING}", 3},
    {"mlp", "split_points: {inp: END, out: BEGINNING}", 3},
    {"mlp_traced", "split_points: {blocks.3: BEGINNING}", 2},
    {"gpt", "split_points: {blocks.1: BEGINNING}", 2},
    {"gpt", "split_points: {blocks.0.mlp: BEGINNING, blocks.1.attn.proj: END}", 3},
    {"gpt", "split_points: {blocks.0.attn: END, ln_f: BEGINNING}", 3},
    {"markers", "", 4},
    {"markers", "split_points: {pair.first: END}", 5},
    {"multi_io", "split_points: {mid: BEGINNING, deep: BEGINNING, head: BEGINNING}", 4},
    {"multi_io", "split_points: {enc_y: END, head: BEGINNING}", 3},
};

INSTANTIATE_TEST_SUITE_P(Explicit, SplitZoo, ::testing::ValuesIn(kExplicitCases));

std::vector<SplitCase> policyCases() {
  std::vector<SplitCase> cases;
  const std::map<std::string, std::string> examples = {
      {"mlp", "[{shape: [8, 8]}]"},
      {"gpt", "[{shape: [4, 16], dtype: int64, high: 64}]"},
      {"multi_io", "[{shape: [6, 8]}, {shape: [6, 8]}, {shape: [6, 8], dtype: int64, high: 2}]"},
  };
  for (const auto& [model, example] : examples) {
    for (const char* policy : {"parameters", "uniform", "cost"}) {
      int max_stages = model == "multi_io" ? 6 : 8;
      for (int stages = 2; stages <= max_stages; ++stages) {
        cases.push_back({model,
                         "num_stages: " + std::to_string(stages) + "\npolicy: " + policy + "\nexample_inputs: " + example,
                         stages});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Policies, SplitZoo, ::testing::ValuesIn(policyCases()));

TEST(SplitGpt, TiedEmbeddingIsListedAndHeldByBothEnds) {
  auto model = frontend::loadModel(testing::zooModelPath("gpt"));
  auto result = stage::splitInMemory(model, partitioner::parseSplitSpec("split_points: {blocks.1: BEGINNING}", "t"));
  const auto& m = result.stages.manifest;
  ASSERT_EQ(m.tied.size(), 1u);
  EXPECT_EQ(m.tied[0], (std::vector<std::string>{"wte.weight", "lm_head.weight"}));
  auto has = [](const std::vector<std::string>& v, const std::string& s) {
    return std::find(v.begin(), v.end(), s) != v.end();
  };
  EXPECT_TRUE(has(m.stages[0].parameters, "wte.weight"));
  EXPECT_FALSE(has(m.stages[0].parameters, "lm_head.weight"));
  EXPECT_TRUE(has(m.stages[1].parameters, "lm_head.weight"));
}

TEST(SplitSeed, StagesHoldOnlyWhatTheyUseUnderOriginalNames) {
  auto model = frontend::loadModel(testing::zooModelPath("seed_example"));
  auto result = stage::splitInMemory(model, partitioner::parseSplitSpec("split_points: {layers.1: BEGINNING}", "t"));
  const auto& m = result.stages.manifest;
  EXPECT_EQ(m.stages[0].parameters,
            (std::vector<std::string>{"emb.weight", "layers.0.lin.weight", "layers.0.lin.bias"}));
  EXPECT_EQ(m.stages[1].parameters,
            (std::vector<std::string>{"layers.1.lin.weight", "layers.1.lin.bias", "lm.proj.weight", "lm.proj.bias"}));
  EXPECT_EQ(m.inputs, (std::vector<std::string>{"x"}));
  ASSERT_EQ(m.stages[1].inputs.size(), 1u);
  EXPECT_EQ(m.stages[1].inputs[0], (stage::ValueSource{stage::ValueSource::Kind::kStage, 0, 0}));
}

TEST(SplitUnused, StateForwardNeverReadsIsListedNotHeld) {
  auto model = frontend::loadModel(testing::zooModelPath("unused_state"));
  auto result = stage::splitInMemory(model, partitioner::parseSplitSpec("split_points: {lin1: BEGINNING}", "t"));
  const auto& m = result.stages.manifest;
  EXPECT_EQ(m.unused, (std::vector<std::string>{"aux.weight", "aux.bias", "calib"}));
  EXPECT_EQ(m.stages[0].parameters, (std::vector<std::string>{"lin0.weight", "lin0.bias"}));
  EXPECT_EQ(m.stages[1].parameters, (std::vector<std::string>{"lin1.weight", "lin1.bias"}));
  EXPECT_TRUE(m.stages[0].buffers.empty() && m.stages[1].buffers.empty());
  EXPECT_EQ(stage::manifestFromJson(stage::manifestToJson(m), "t").unused, m.unused);

  // The tied head of the gpt is one tensor with the embedding, not unused.
  auto gpt = frontend::loadModel(testing::zooModelPath("gpt"));
  auto gpt_split = stage::splitInMemory(gpt, partitioner::parseSplitSpec("split_points: {blocks.1: BEGINNING}", "t"));
  EXPECT_TRUE(gpt_split.stages.manifest.unused.empty());
}

TEST(SplitMultiIO, SkipConnectionTravelsDirectlyTwoStagesAhead) {
  auto model = frontend::loadModel(testing::zooModelPath("multi_io"));
  auto result = stage::splitInMemory(
      model, partitioner::parseSplitSpec("split_points: {mid: BEGINNING, deep: BEGINNING, head: BEGINNING}", "t"));
  const auto& m = result.stages.manifest;
  ASSERT_EQ(m.num_stages, 4);
  bool direct_from_stage0 = false;
  // `out = head(h + skip)`: the add runs at the end of stage 2, two stages after `skip` is made.
  for (const auto& in : m.stages[2].inputs) {
    direct_from_stage0 = direct_from_stage0 || (in.kind == stage::ValueSource::Kind::kStage && in.stage == 0);
  }
  EXPECT_TRUE(direct_from_stage0) << "stage 2 should read `skip` straight from stage 0";
  EXPECT_EQ(m.stages[1].inputs.size(), 1u) << "stage 1 must not relay `skip`";
  // The integer mask is a root input read only where it is used.
  EXPECT_EQ(m.stages[0].inputs.size(), 3u);
}

TEST(SplitToDirectory, WritesLoadableFilesAtomically) {
  std::string dir = testing::makeTempDir("pf-split");
  std::string out = dir + "/stages";
  stage::SplitRequest request;
  request.model_path = testing::zooModelPath("gpt");
  request.out_dir = out;
  std::string spec_path = dir + "/spec.yaml";
  {
    std::ofstream(spec_path) << "split_points:\n  blocks.1: BEGINNING\n";
  }
  request.spec_path = spec_path;
  auto summary = stage::splitModelToDirectory(request);
  EXPECT_EQ(summary.manifest.num_stages, 2);
  auto manifest = stage::readManifest(out);
  EXPECT_EQ(manifest, summary.manifest);
  std::vector<torch::jit::Module> loaded;
  for (const auto& s : manifest.stages) loaded.push_back(torch::jit::load(out + "/" + s.file));
  expectSplitMatchesModel({"gpt", "", 2}, loaded, manifest);
  // A second split into the same folder is refused without --force, and nothing changes.
  EXPECT_THROW(stage::splitModelToDirectory(request), std::runtime_error);
  request.force = true;
  EXPECT_NO_THROW(stage::splitModelToDirectory(request));
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) entries += e.path().filename() != "spec.yaml";
  EXPECT_EQ(entries, 1) << "no temporary folders left behind";
  std::filesystem::remove_all(dir);
}

TEST(SplitStages, RunBackwardThroughEveryStage) {
  auto model = frontend::loadModel(testing::zooModelPath("gpt"));
  auto result = stage::splitInMemory(model, partitioner::parseSplitSpec("num_stages: 3\npolicy: uniform", "t"));
  auto ref = testing::loadReference("gpt");
  auto outputs = stage::runChained(result.stages.modules, result.stages.manifest, ref.inputs);
  outputs[0].sum().backward();
  for (auto& m : result.stages.modules) {
    for (const auto& p : m.named_parameters(true)) {
      EXPECT_TRUE(p.value.grad().defined()) << p.name;
    }
  }
}

}  // namespace
}  // namespace pipeforge

namespace pipeforge {
namespace {

TEST(SplitPolicy, OpensDeeperWhenThatBalancesBetter) {
  // Two blocks cannot fill four even stages at the top level; their children can.
  auto model = frontend::loadModel(testing::zooModelPath("gpt"));
  auto result = stage::splitInMemory(model, partitioner::parseSplitSpec("num_stages: 4\npolicy: parameters", "t"));
  EXPECT_LT(result.partition.imbalance, 1.1) << result.partition.balance;
  bool opened_block = false;
  for (auto v : boost::make_iterator_range(boost::vertices(result.dag.graph))) {
    opened_block = opened_block || result.dag.graph[v].callee.rfind("blocks.0.", 0) == 0;
  }
  EXPECT_TRUE(opened_block) << "blocks.0 should have been opened into its children";
  // uniform stays at the shallowest level with enough cut points.
  auto uniform = stage::splitInMemory(model, partitioner::parseSplitSpec("num_stages: 4\npolicy: uniform", "t"));
  for (auto v : boost::make_iterator_range(boost::vertices(uniform.dag.graph))) {
    EXPECT_NE(uniform.dag.graph[v].callee.rfind("blocks.0.", 0), 0u) << uniform.dag.graph[v].callee;
  }
}

}  // namespace
}  // namespace pipeforge
