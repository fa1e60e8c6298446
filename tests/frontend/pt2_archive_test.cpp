// The PT2 reader: every zoo archive reads with the reference's names, shapes
// and values; every broken file gives its own clear error.
#include "frontend/pt2_archive.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <torch/script.h>

#include <filesystem>
#include <fstream>

#include "common/safetensors.h"
#include "frontend/load_model.h"
#include "frontend/pt2_weights.h"
#include "tests/frontend/pt2_zoo.h"
#include "tests/support/zoo.h"

namespace pipeforge {
namespace {

using frontend::Pt2Archive;
using frontend::Pt2Error;

class Pt2ReadZoo : public ::testing::TestWithParam<std::string> {};

TEST_P(Pt2ReadZoo, TensorsHaveTheReferenceNamesShapesAndValues) {
  auto archive = Pt2Archive::open(testing::pt2ZooPath(GetParam()));
  auto ref = testing::loadPt2Reference(GetParam());
  EXPECT_EQ(archive.schemaVersion().rfind("8.", 0), 0u) << archive.schemaVersion();
  EXPECT_EQ(archive.modelName(), "model");
  ASSERT_FALSE(ref.state.empty());
  std::set<std::string> names;
  for (const auto& e : archive.tensors()) names.insert(e.fqn);
  for (const auto& [name, value] : ref.state) {
    ASSERT_TRUE(archive.hasTensor(name)) << name;
    const at::Tensor& t = archive.tensor(name);
    EXPECT_EQ(t.sizes(), value.sizes()) << name;
    EXPECT_EQ(t.scalar_type(), value.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(t, value)) << name;
    names.erase(name);
  }
  EXPECT_TRUE(names.empty()) << "tensors not in the state_dict, first: " << *names.begin();
}

TEST_P(Pt2ReadZoo, SignatureListsEveryLiftedTensorAndTheUserInputs) {
  auto archive = Pt2Archive::open(testing::pt2ZooPath(GetParam()));
  auto ref = testing::loadPt2Reference(GetParam());
  size_t user_inputs = 0;
  for (const auto& in : archive.signature().inputs) {
    if (in.kind == frontend::Pt2InputKind::kUserInput) {
      ++user_inputs;
      continue;
    }
    EXPECT_TRUE(archive.hasTensor(in.target)) << in.target;
    EXPECT_FALSE(in.value.empty());
  }
  EXPECT_EQ(user_inputs, ref.inputs.size());
  size_t user_outputs = 0;
  for (const auto& out : archive.signature().outputs) user_outputs += out.kind == frontend::Pt2OutputKind::kUserOutput;
  EXPECT_EQ(user_outputs, ref.outputs.size());
}

INSTANTIATE_TEST_SUITE_P(Zoo, Pt2ReadZoo,
                         ::testing::Values("gpt", "gpt_dynamic", "multi_io", "markers", "resnet_train", "resnet_eval",
                                           "resnet_functional", "cond_model", "while_model"));

TEST(Pt2Read, TiedWeightsAreOneTensor) {
  auto archive = Pt2Archive::open(testing::pt2ZooPath("gpt"));
  EXPECT_TRUE(archive.tensor("wte.weight").is_same(archive.tensor("lm_head.weight")));
  EXPECT_FALSE(archive.tensor("wte.weight").is_same(archive.tensor("wpe.weight")));
  EXPECT_TRUE(archive.tensor("wte.weight").requires_grad());
  EXPECT_FALSE(archive.tensor("blocks.0.attn.causal_mask").requires_grad());
}

// A bf16 checkpoint of an fp32 export: each value stays the checkpoint's
// view until read (a split converts one tensor at a time as it writes it,
// Note [Weights by FQN]); read, it is the fp32 of those bf16 values, once
// for both names of a tie, and requires grad as the parameter did.
TEST(Pt2Read, Bf16WeightsAreConvertedWhenRead) {
  const std::string model = testing::pt2ZooPath("gpt");
  auto plain = Pt2Archive::open(model);
  const std::string dir = testing::makeTempDir("pf-bf16-weights");
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, at::Tensor> written;
  for (const auto& e : plain.tensors()) {
    if (e.fqn == "lm_head.weight") continue;  // tied to wte.weight, as save_pretrained leaves it out
    at::Tensor value = plain.tensor(e.fqn).detach();
    if (at::isFloatingType(value.scalar_type())) value = value.to(at::kBFloat16);
    value = value.contiguous();
    written[e.fqn] = value;
    const std::string dtype = value.scalar_type() == at::kBFloat16 ? "BF16"
                              : value.scalar_type() == at::kBool   ? "BOOL"
                                                                   : "I64";
    entries.push_back({e.fqn, dtype, value.sizes().vec(), static_cast<std::size_t>(value.nbytes()),
                       [value](std::uint8_t* out) { std::memcpy(out, value.data_ptr(), value.nbytes()); }});
  }
  writeSafetensors(dir + "/model.safetensors", entries,
                   {{"format", "pt"}, {frontend::kTiedWeightsKey, R"({"lm_head.weight": "wte.weight"})"}});

  frontend::Pt2OpenOptions options;
  options.weights = {dir + "/model.safetensors"};
  auto archive = Pt2Archive::open(model, options);
  const auto& wte = archive.entry("wte.weight");
  EXPECT_EQ(wte.convert_to, static_cast<int>(at::kFloat));
  EXPECT_TRUE(wte.source_view);
  EXPECT_EQ(archive.entry("lm_head.weight").convert_to, static_cast<int>(at::kFloat));
  EXPECT_EQ(archive.stored("wte.weight").scalar_type(), at::kBFloat16);
  EXPECT_TRUE(archive.stored("wte.weight").is_same(archive.stored("lm_head.weight")));

  const at::Tensor& read = archive.tensor("lm_head.weight");
  EXPECT_EQ(read.scalar_type(), at::kFloat);
  EXPECT_TRUE(read.equal(written["wte.weight"].to(at::kFloat)));
  EXPECT_TRUE(read.requires_grad());
  EXPECT_TRUE(archive.tensor("wte.weight").is_same(read));  // one conversion for the tie
  EXPECT_EQ(archive.entry("wte.weight").convert_to, -1);
  EXPECT_FALSE(archive.entry("wte.weight").source_view);
  for (const auto& e : archive.tensors()) {
    const at::Tensor value = archive.tensor(e.fqn);
    EXPECT_EQ(value.scalar_type(), plain.tensor(e.fqn).scalar_type()) << e.fqn;
    EXPECT_TRUE(value.equal(written[e.fqn == "lm_head.weight" ? "wte.weight" : e.fqn].to(value.scalar_type())))
        << e.fqn;
  }
  std::filesystem::remove_all(dir);
}

TEST(Pt2Read, NodesCarryTheirModuleStack) {
  auto archive = Pt2Archive::open(testing::pt2ZooPath("gpt"));
  bool found = false;
  for (const auto& n : archive.nodes()) {
    if (n.module_stack.empty() || n.module_stack.back().path != "blocks.0.attn.qkv") continue;
    found = true;
    EXPECT_EQ(n.target, "torch.ops.aten.linear.default");
    EXPECT_EQ(n.module_stack.back().type, "torch.nn.modules.linear.Linear");
    ASSERT_EQ(n.module_stack.size(), 4u);  // root, blocks.0, blocks.0.attn, blocks.0.attn.qkv
    EXPECT_EQ(n.module_stack[0].path, "");
    EXPECT_EQ(n.module_stack[1].path, "blocks.0");
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(archive.verifiers(), (std::vector<std::string>{"TRAINING"}));
  ASSERT_FALSE(archive.moduleCallGraph().empty());
  EXPECT_EQ(archive.moduleCallGraph()[0], "");
}

TEST(Pt2Read, TrainModeBatchNormKeepsInPlaceBufferUpdates) {
  auto archive = Pt2Archive::open(testing::pt2ZooPath("resnet_train"));
  int buffers = 0;
  for (const auto& in : archive.signature().inputs) buffers += in.kind == frontend::Pt2InputKind::kBuffer;
  EXPECT_EQ(buffers, 3 * 10);  // running_mean, running_var, num_batches_tracked of 10 BatchNorms
  for (const auto& out : archive.signature().outputs) EXPECT_EQ(out.kind, frontend::Pt2OutputKind::kUserOutput);
  int in_place = 0;
  for (const auto& n : archive.nodes()) in_place += n.target == "torch.ops.aten.add_.Tensor";
  EXPECT_EQ(in_place, 10);
}

TEST(Pt2Read, FunctionalIrReturnsBufferMutations) {
  auto archive = Pt2Archive::open(testing::pt2ZooPath("resnet_functional"));
  EXPECT_EQ(archive.verifiers(), (std::vector<std::string>{"ATEN"}));
  std::set<std::string> mutated;
  for (const auto& out : archive.signature().outputs) {
    if (out.kind == frontend::Pt2OutputKind::kBufferMutation) mutated.insert(out.target);
  }
  EXPECT_EQ(mutated.size(), 3u * 10);
  EXPECT_TRUE(mutated.count("layer2.0.downsample.1.running_var"));
}

TEST(Pt2Read, ModuleStackParsing) {
  auto frames = frontend::parseModuleStack(
      "L__self__,,m.Net;L__self__a,a,m.Gen[int, str];_empty_nn_module_stack_from_metadata_hook,"
      "_empty_nn_module_stack_from_metadata_hook,_empty_nn_module_stack_from_metadata_hook");
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[1].key, "L__self__a");
  EXPECT_EQ(frames[1].path, "a");
  EXPECT_EQ(frames[1].type, "m.Gen[int, str]");
  EXPECT_TRUE(frontend::parseModuleStack("").empty());
}

TEST(Pt2Read, SourceLocationIsTheModelsLineNotTorchs) {
  auto node = nlohmann::ordered_json::parse(R"j({"target": "torch.ops.aten.linear.default", "metadata": {
    "stack_trace": "File \"/x/modeling_llama.py\", line 467, in forward\n    outputs = self.model(\n  File \"/x/modeling_llama.py\", line 98, in forward\n    q = self.q_proj(h)\n  File \"/v/lib/python3.11/site-packages/torch/nn/modules/linear.py\", line 134, in forward\n    return F.linear(input, self.weight, self.bias)"}})j");
  auto where = frontend::pt2SourceLocation(node);
  EXPECT_EQ(where.file, "modeling_llama.py");
  EXPECT_EQ(where.line, 98);
  EXPECT_EQ(where.code, "q = self.q_proj(h)");
  EXPECT_EQ(frontend::pt2SourceLine(node), "modeling_llama.py:98");
  // Only torch's own frames: the innermost one.
  auto only_torch = nlohmann::ordered_json::parse(R"j({"metadata": {"stack_trace":
    "File \"/v/site-packages/torch/nn/modules/linear.py\", line 134, in forward\n    return F.linear(x)"}})j");
  EXPECT_EQ(frontend::pt2SourceLine(only_torch), "linear.py:134");
  // No trace (export keeps none on higher-order nodes): nothing, not a guess.
  EXPECT_EQ(frontend::pt2SourceLine(nlohmann::ordered_json::parse(R"({"metadata": {}})")), "");
  EXPECT_EQ(frontend::pt2SourceLine(nlohmann::ordered_json::parse(R"({"metadata": {"stack_trace": "garbage"}})")), "");
}

TEST(Pt2Read, ArchiveKindIsDecidedByContent) {
  using frontend::ArchiveKind;
  EXPECT_EQ(frontend::detectArchiveKind(testing::pt2ZooPath("gpt")), ArchiveKind::kPt2);
  EXPECT_EQ(frontend::detectArchiveKind(testing::pt2ZooPath("legacy_flat")), ArchiveKind::kLegacyExport);
  EXPECT_EQ(frontend::detectArchiveKind(testing::zooModelPath("gpt")), ArchiveKind::kTorchScript);
  // A .pt2 renamed to .pt is still recognised.
  std::string dir = testing::makeTempDir("pf-pt2-kind");
  std::filesystem::copy_file(testing::pt2ZooPath("markers"), dir + "/renamed.pt");
  EXPECT_EQ(frontend::detectArchiveKind(dir + "/renamed.pt"), ArchiveKind::kPt2);
  std::filesystem::remove_all(dir);
}

struct BadFile {
  std::string file;                    // zoo name, or "text:" for a text file named model.pt2
  std::vector<std::string> expected;  // substrings of the message
};

std::ostream& operator<<(std::ostream& os, const BadFile& b) { return os << b.file; }

class Pt2BadFiles : public ::testing::TestWithParam<BadFile> {};

TEST_P(Pt2BadFiles, LoadModelGivesAClearError) {
  const BadFile& b = GetParam();
  std::string dir;
  std::string path;
  if (b.file == "text:") {
    dir = testing::makeTempDir("pf-pt2-bad");
    path = dir + "/model.pt2";
    std::ofstream(path) << "this is not a zip\n";
  } else {
    path = testing::pt2ZooPath(b.file);
  }
  try {
    frontend::loadModel(path);
    ADD_FAILURE() << "loading " << path << " should fail";
  } catch (const Pt2Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    for (const auto& s : b.expected) EXPECT_NE(what.find(s), std::string::npos) << "'" << s << "' not in: " << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << "one line: " << what;
  }
  if (!dir.empty()) std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Errors, Pt2BadFiles,
    ::testing::Values(BadFile{"bad_truncated", {"central directory is missing", "truncated", "torch.export.save"}},
                      BadFile{"text:", {"not a zip archive"}},
                      BadFile{"bad_schema", {"schema version 999.", "schema 8.x", "re-export"}},
                      BadFile{"bad_archive_version", {"archive_version '7'", "re-save"}},
                      BadFile{"bad_aoti", {"AOTInductor package", "torch.export.save(ep"}},
                      BadFile{"legacy_flat", {"torch 2.1-2.7", "torch.export.load"}},
                      BadFile{"bad_unknown_op", {"pf_zoo::mystery.default", "TORCH_LIBRARY"}},
                      BadFile{"bad_non_tensor_out", {"output 1", "not a tensor"}}));

}  // namespace
}  // namespace pipeforge
