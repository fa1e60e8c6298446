// The PT2 importer: the rebuilt module computes what the exported program
// computes, keeps the original module tree and names, and splits through the
// unchanged split path (explicit points at any depth, markers, policies).
#include "frontend/pt2_import.h"

#include <gtest/gtest.h>

#include <torch/script.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "frontend/load_model.h"
#include "frontend/module_paths.h"
#include "frontend/pt2_archive.h"
#include "partitioner/split_spec.h"
#include "stage/run_chained.h"
#include "stage/split_in_memory.h"
#include "stage/split_model.h"
#include "tests/frontend/pt2_zoo.h"
#include "tests/support/build_paths.h"
#include "tests/support/run_command.h"
#include "tests/support/zoo.h"

namespace pipeforge {
namespace {

constexpr double kTolerance = 1e-6;

std::map<std::string, at::Tensor> stateDict(const torch::jit::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m.named_parameters(true)) out[p.name] = p.value;
  for (const auto& b : m.named_buffers(true)) out[b.name] = b.value;
  return out;
}

void expectOutputsMatch(const std::vector<at::Tensor>& outputs, const testing::Pt2Reference& ref) {
  ASSERT_EQ(outputs.size(), ref.outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    EXPECT_EQ(outputs[i].sizes(), ref.outputs[i].sizes()) << "output " << i;
    EXPECT_LE(testing::maxAbsDiff(outputs[i], ref.outputs[i]), kTolerance) << "output " << i;
  }
}

class Pt2ImportZoo : public ::testing::TestWithParam<std::string> {};

TEST_P(Pt2ImportZoo, ForwardEqualsTheReference) {
  auto model = frontend::loadModel(testing::pt2ZooPath(GetParam()));
  auto ref = testing::loadPt2Reference(GetParam());
  expectOutputsMatch(testing::runForward(model, ref.inputs), ref);
  // In-place buffer updates (BatchNorm in train mode) happen as in eager.
  auto state = stateDict(model);
  for (const auto& [name, after] : ref.after) {
    ASSERT_TRUE(state.count(name)) << name;
    EXPECT_LE(testing::maxAbsDiff(state[name], after), kTolerance) << name;
  }
}

TEST_P(Pt2ImportZoo, KeepsTheStateDictNamesAndTheModuleTree) {
  auto model = frontend::loadModel(testing::pt2ZooPath(GetParam()));
  auto ref = testing::loadPt2Reference(GetParam());
  auto state = stateDict(model);
  std::set<std::string> names;
  for (const auto& [name, t] : state) names.insert(name);
  std::set<std::string> expected;
  for (const auto& [name, t] : ref.state) expected.insert(name);
  EXPECT_EQ(names, expected);
  // Parameters come in state_dict order (weight before bias), as torch lists them.
  std::vector<std::string> params;
  for (const auto& p : model.named_parameters(true)) params.push_back(p.name);
  std::vector<std::string> expected_params;
  for (const auto& name : ref.state_order) {
    if (std::find(params.begin(), params.end(), name) != params.end()) expected_params.push_back(name);
  }
  EXPECT_EQ(params, expected_params);
  auto archive = frontend::Pt2Archive::open(testing::pt2ZooPath(GetParam()));
  auto paths = frontend::submodulePaths(model);
  for (const auto& fqn : archive.moduleCallGraph()) {
    if (fqn.empty()) continue;
    EXPECT_NE(std::find(paths.begin(), paths.end(), fqn), paths.end()) << fqn;
  }
}

INSTANTIATE_TEST_SUITE_P(Zoo, Pt2ImportZoo,
                         ::testing::Values("gpt", "gpt_dynamic", "multi_io", "markers", "resnet_train", "resnet_eval",
                                           "resnet_functional", "cond_model", "while_model", "regions"));

TEST(Pt2Import, CallsBecomeMethodsOfTheOriginalSubmodules) {
  auto model = frontend::loadModel(testing::pt2ZooPath("gpt"));
  auto attn = model.attr("blocks").toModule().attr("0").toModule().attr("attn").toModule();
  ASSERT_TRUE(attn.find_method("forward"));
  std::string text = attn.get_method("forward").graph()->toString();
  EXPECT_NE(text.find("prim::CallMethod[name=\"forward\"]"), std::string::npos) << text;  // qkv, proj
  EXPECT_NE(text.find("aten::softmax"), std::string::npos) << text;
  // The tied head reads its own name; both names are one tensor.
  auto state = stateDict(model);
  EXPECT_TRUE(state.at("wte.weight").is_same(state.at("lm_head.weight")));
}

TEST(Pt2Import, BothMarkerOpsBecomeOurMarker) {
  auto model = frontend::loadModel(testing::pt2ZooPath("markers"));
  int markers = 0;
  std::function<void(const torch::jit::Module&)> count = [&](const torch::jit::Module& m) {
    for (const auto& method : m.get_methods()) {
      for (const auto* n : method.graph()->nodes()) markers += n->kind().toQualString() == std::string("pipeforge::pipe_split");
    }
    for (const auto& child : m.children()) count(child);
  };
  count(model);
  EXPECT_EQ(markers, 4);  // ours twice at top level, pippy's once there and once inside `pair`
}

TEST(Pt2Import, DynamicBatchRunsAtOtherBatchSizes) {
  auto model = frontend::loadModel(testing::pt2ZooPath("gpt_dynamic"));
  auto ref = testing::loadPt2Reference("gpt_dynamic");  // batch 3; exported with batch 4
  ASSERT_EQ(ref.inputs[0].toTensor().size(0), 3);
  expectOutputsMatch(testing::runForward(model, ref.inputs), ref);
  auto wide = at::cat({ref.inputs[0].toTensor(), ref.inputs[0].toTensor()}, 0);  // batch 6
  auto out = testing::runForward(model, {wide});
  EXPECT_LE(testing::maxAbsDiff(out[0].slice(0, 3, 6), ref.outputs[0]), kTolerance);
}

// --- splitting -------------------------------------------------------------

struct SplitCase {
  std::string model;
  std::string spec_yaml;
  int expected_stages;  // 0: don't check
};

std::ostream& operator<<(std::ostream& os, const SplitCase& c) { return os << c.model << " | " << c.spec_yaml; }

void expectStagesMatch(const SplitCase& c, std::vector<torch::jit::Module>& modules,
                       const stage::PipeManifest& manifest) {
  auto model = frontend::loadModel(testing::pt2ZooPath(c.model));
  auto ref = testing::loadPt2Reference(c.model);
  torch::NoGradGuard no_grad;
  expectOutputsMatch(stage::runChained(modules, manifest, ref.inputs), ref);
  auto original = stateDict(model);
  std::set<std::string> covered;
  for (size_t k = 0; k < modules.size(); ++k) {
    for (const auto& [name, tensor] : stateDict(modules[k])) {
      ASSERT_TRUE(original.count(name)) << "stage " << k << " has '" << name << "', not an original key";
      EXPECT_EQ(tensor.sizes(), original[name].sizes()) << name;
      covered.insert(name);
    }
  }
  // State forward never reads (eval BatchNorm's num_batches_tracked) is listed as unused.
  covered.insert(manifest.unused.begin(), manifest.unused.end());
  for (const auto& [name, tensor] : original) EXPECT_TRUE(covered.count(name)) << name << " is in no stage";
}

class Pt2SplitZoo : public ::testing::TestWithParam<SplitCase> {};

TEST_P(Pt2SplitZoo, ChainedStagesReproduceTheModel) {
  const SplitCase& c = GetParam();
  auto model = frontend::loadModel(testing::pt2ZooPath(c.model));
  auto result = stage::splitInMemory(model, partitioner::parseSplitSpec(c.spec_yaml, "test spec"));
  if (c.expected_stages) EXPECT_EQ(result.partition.num_stages, c.expected_stages);
  expectStagesMatch(c, result.stages.modules, result.stages.manifest);
}

const std::vector<SplitCase> kExplicitCases = {
    {"gpt", "split_points: {blocks.1: BEGINNING}", 2},
    {"gpt", "split_points: {blocks.0.mlp: BEGINNING, blocks.1.attn.proj: END}", 3},
    {"gpt", "split_points: {blocks.0.attn.qkv: END, ln_f: BEGINNING}", 3},
    {"gpt_dynamic", "split_points: {blocks.0.attn: END, blocks.1.mlp.fc: BEGINNING}", 3},
    {"multi_io", "split_points: {mid: BEGINNING, deep: BEGINNING, head: BEGINNING}", 4},
    {"resnet_train", "split_points: {layer1.1.conv2: BEGINNING, layer2.0.downsample: BEGINNING}", 3},
    {"resnet_eval", "split_points: {layer1.1: BEGINNING, layer2.1.bn1: END}", 3},
    {"markers", "", 4},
    {"markers", "split_points: {pair.first: END}", 5},
    {"resnet_functional", "split_points: {layer1: END, layer2.1.conv1: BEGINNING}", 3},
    {"cond_model", "split_points: {out: BEGINNING}", 2},
    {"while_model", "split_points: {out: BEGINNING}", 2},
};

INSTANTIATE_TEST_SUITE_P(Explicit, Pt2SplitZoo, ::testing::ValuesIn(kExplicitCases));

std::vector<SplitCase> policyCases() {
  std::vector<SplitCase> cases;
  const std::vector<std::pair<std::string, std::string>> examples = {
      {"gpt", "[{shape: [4, 16], dtype: int64, high: 64}]"},
      {"multi_io", "[{shape: [6, 8]}, {shape: [6, 8]}, {shape: [6, 8], dtype: int64, high: 2}]"},
      {"resnet_train", "[{shape: [4, 3, 8, 8]}]"},
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

INSTANTIATE_TEST_SUITE_P(Policies, Pt2SplitZoo, ::testing::ValuesIn(policyCases()));

class Pt2SplitInsideHigherOrderOp : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(Pt2SplitInsideHigherOrderOp, IsRefused) {
  auto [model_name, fqn] = GetParam();
  auto model = frontend::loadModel(testing::pt2ZooPath(model_name));
  try {
    stage::splitInMemory(model, partitioner::parseSplitSpec("split_points: {" + fqn + ": BEGINNING}", "t"));
    ADD_FAILURE() << "a split inside a cond / while_loop body must be refused";
  } catch (const partitioner::SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("inside a loop or if body"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Pt2Split, Pt2SplitInsideHigherOrderOp,
                         ::testing::Values(std::make_pair("cond_model", "pos"), std::make_pair("cond_model", "neg"),
                                           std::make_pair("while_model", "step")));

// Note [PT2 regions]: a no-grad region stops gradients exactly where eager
// PyTorch does, and an autocast region computes in bfloat16 and trains.
TEST(Pt2Regions, GradientsStopAtTheNoGradRegionAndFlowThroughAutocast) {
  auto model = frontend::loadModel(testing::pt2ZooPath("regions"));
  auto ref = testing::loadPt2Reference("regions");
  auto result = model.forward(ref.inputs);  // with grad, unlike testing::runForward
  std::vector<at::Tensor> outputs{result.isTuple() ? result.toTupleRef().elements()[0].toTensor() : result.toTensor()};
  expectOutputsMatch(outputs, ref);
  outputs[0].sum().backward();
  for (const auto& p : model.named_parameters(true)) {
    bool in_gate = p.name.rfind("gate.", 0) == 0;
    EXPECT_EQ(p.value.grad().defined(), !in_gate) << p.name;
    if (!in_gate) EXPECT_GT(p.value.grad().abs().sum().item<double>(), 0.0) << p.name;
  }
  EXPECT_TRUE(at::GradMode::is_enabled()) << "the region put grad mode back";
}

TEST(Pt2Regions, TheRegionIsAStatementOfItsModule) {
  auto model = frontend::loadModel(testing::pt2ZooPath("regions"));
  std::string text = model.get_method("forward").graph()->toString();
  EXPECT_NE(text.find("aten::set_grad_enabled"), std::string::npos) << text;
  EXPECT_NE(text.find("pipeforge::autocast_enter"), std::string::npos) << text;
  EXPECT_NE(text.find("pipeforge::autocast_exit"), std::string::npos) << text;
  EXPECT_NE(text.find("a torch.no_grad() region of forward (generate_pt2_zoo.py:"), std::string::npos) << text;
  // A split point before, between or after the regions works, and the
  // stages chained equal the model.
  auto ref = testing::loadPt2Reference("regions");
  for (const char* spec : {"split_points: {main: BEGINNING}", "split_points: {out: BEGINNING}"}) {
    auto result = stage::splitInMemory(model, partitioner::parseSplitSpec(spec, "t"));
    torch::NoGradGuard no_grad;
    expectOutputsMatch(stage::runChained(result.stages.modules, result.stages.manifest, ref.inputs), ref);
  }
}

TEST(Pt2Regions, ASplitPointInsideARegionIsRefusedNamingIt) {
  auto model = frontend::loadModel(testing::pt2ZooPath("regions"));
  const std::pair<const char*, const char*> cases[] = {
      {"gate", "is inside a torch.no_grad() region of forward (generate_pt2_zoo.py:"},
      {"cast", "is inside a torch.autocast region of forward (generate_pt2_zoo.py:"},
  };
  for (const auto& [fqn, expected] : cases) {
    try {
      stage::splitInMemory(model, partitioner::parseSplitSpec(std::string("split_points: {") + fqn + ": END}", "t"));
      ADD_FAILURE() << "a split point inside a region must be refused: " << fqn;
    } catch (const partitioner::SpecError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  }
}

TEST(Pt2Split, TiedEmbeddingIsListedAndHeldByBothEnds) {
  auto model = frontend::loadModel(testing::pt2ZooPath("gpt"));
  auto result = stage::splitInMemory(model, partitioner::parseSplitSpec("split_points: {blocks.1: BEGINNING}", "t"));
  const auto& m = result.stages.manifest;
  ASSERT_EQ(m.tied.size(), 1u);
  std::set<std::string> group(m.tied[0].begin(), m.tied[0].end());
  EXPECT_EQ(group, (std::set<std::string>{"wte.weight", "lm_head.weight"}));
  auto has = [](const std::vector<std::string>& v, const std::string& s) {
    return std::find(v.begin(), v.end(), s) != v.end();
  };
  EXPECT_TRUE(has(m.stages[0].parameters, "wte.weight"));
  EXPECT_TRUE(has(m.stages[1].parameters, "lm_head.weight"));
  EXPECT_FALSE(has(m.stages[0].parameters, "lm_head.weight"));
}

// Note [PT2 stage files]: a split of a .pt2 writes stage_<i>.pt2, which the
// runtime loads back through the importer; chained, they equal the model.
class Pt2StageFiles : public ::testing::TestWithParam<SplitCase> {};

TEST_P(Pt2StageFiles, LoadBackThroughTheImporterAndEqualTheModel) {
  const SplitCase& c = GetParam();
  std::string dir = testing::makeTempDir("pf-pt2-split");
  stage::SplitRequest request;
  request.model_path = testing::pt2ZooPath(c.model);
  if (!c.spec_yaml.empty()) {
    request.spec_path = dir + "/spec.yaml";
    std::ofstream(*request.spec_path) << c.spec_yaml;
  }
  request.out_dir = dir + "/stages";
  auto summary = stage::splitModelToDirectory(request);
  if (c.expected_stages) ASSERT_EQ(summary.manifest.num_stages, c.expected_stages);
  std::ifstream json(request.out_dir + "/pipe.json");
  std::string text((std::istreambuf_iterator<char>(json)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"stage_format\": \"pt2\""), std::string::npos) << text;
  EXPECT_EQ(stage::readManifest(request.out_dir), summary.manifest);
  std::vector<torch::jit::Module> loaded;
  for (const auto& s : summary.manifest.stages) {
    EXPECT_EQ(s.file, "stage_" + std::to_string(s.index) + ".pt2");
    EXPECT_EQ(frontend::detectArchiveKind(request.out_dir + "/" + s.file), frontend::ArchiveKind::kPt2);
    loaded.push_back(frontend::loadModel(request.out_dir + "/" + s.file));
    std::set<std::string> held;
    for (const auto& [name, tensor] : stateDict(loaded.back())) held.insert(name);
    std::set<std::string> listed(s.parameters.begin(), s.parameters.end());
    listed.insert(s.buffers.begin(), s.buffers.end());
    EXPECT_EQ(held, listed) << "stage " << s.index;
  }
  expectStagesMatch(c, loaded, summary.manifest);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Explicit, Pt2StageFiles, ::testing::ValuesIn(kExplicitCases));
INSTANTIATE_TEST_SUITE_P(Policies, Pt2StageFiles,
                         ::testing::Values(SplitCase{"gpt", "num_stages: 4\npolicy: parameters", 4},
                                           SplitCase{"resnet_eval", "num_stages: 4\npolicy: uniform", 4},
                                           SplitCase{"gpt_dynamic", "num_stages: 5\npolicy: uniform", 5}));

TEST(Pt2Split, GptStagesHoldTheTiedWeightUnderTheirOwnNames) {
  std::string dir = testing::makeTempDir("pf-pt2-split");
  stage::SplitRequest request;
  request.model_path = testing::pt2ZooPath("gpt");
  request.spec_path = dir + "/spec.yaml";
  std::ofstream(*request.spec_path) << "split_points: {blocks.1: BEGINNING}";
  request.out_dir = dir + "/stages";
  auto m = stage::splitModelToDirectory(request).manifest;
  ASSERT_EQ(m.num_stages, 2);
  auto first = frontend::loadModel(request.out_dir + "/stage_0.pt2");
  auto last = frontend::loadModel(request.out_dir + "/stage_1.pt2");
  EXPECT_TRUE(stateDict(first).count("wte.weight"));
  EXPECT_FALSE(stateDict(first).count("lm_head.weight"));
  EXPECT_TRUE(stateDict(last).count("lm_head.weight"));
  EXPECT_FALSE(stateDict(last).count("wte.weight"));
  std::filesystem::remove_all(dir);
}

TEST(Pt2Split, StagesTrainBackwardThroughEveryStage) {
  auto model = frontend::loadModel(testing::pt2ZooPath("resnet_train"));
  auto result = stage::splitInMemory(model, partitioner::parseSplitSpec("num_stages: 3\npolicy: uniform", "t"));
  auto ref = testing::loadPt2Reference("resnet_train");
  auto outputs = stage::runChained(result.stages.modules, result.stages.manifest, ref.inputs);
  outputs[0].sum().backward();
  for (auto& m : result.stages.modules) {
    for (const auto& p : m.named_parameters(true)) EXPECT_TRUE(p.value.grad().defined()) << p.name;
  }
}

// --- the CLI ---------------------------------------------------------------

TEST(Pt2Cli, SplitsAPt2AndInspectsTheStages) {
  std::string dir = testing::makeTempDir("pf-pt2-cli");
  std::string spec = dir + "/spec.yaml";
  std::ofstream(spec) << "split_points:\n  layer2: BEGINNING\n";
  auto split = testing::runCommand(std::string(PIPEFORGE_BINARY) + " split '" + testing::pt2ZooPath("resnet_eval") +
                                   "' --spec '" + spec + "' --out '" + dir + "/out'");
  EXPECT_EQ(split.exit_code, 0) << split.output;
  EXPECT_NE(split.output.find("into 2 stages"), std::string::npos) << split.output;
  auto inspect = testing::runCommand(std::string(PIPEFORGE_BINARY) + " inspect '" + dir + "/out'");
  EXPECT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("running_mean"), std::string::npos) << inspect.output;
  std::filesystem::remove_all(dir);
}

class Pt2CliBadFile : public ::testing::TestWithParam<std::string> {};

TEST_P(Pt2CliBadFile, ExitsOneWithOneLine) {
  std::string dir = testing::makeTempDir("pf-pt2-cli-bad");
  auto result = testing::runCommand(std::string(PIPEFORGE_BINARY) + " split '" + testing::pt2ZooPath(GetParam()) +
                                    "' --out '" + dir + "/out'");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_EQ(result.output.rfind("pipeforge split: error: ", 0), 0u) << result.output;
  EXPECT_EQ(std::count(result.output.begin(), result.output.end(), '\n'), 1) << result.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/out")) << "a failed split leaves nothing";
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Errors, Pt2CliBadFile,
                         ::testing::Values("bad_truncated", "bad_schema", "bad_archive_version", "bad_aoti",
                                           "legacy_flat", "bad_unknown_op", "bad_non_tensor_out"));

}  // namespace
}  // namespace pipeforge
