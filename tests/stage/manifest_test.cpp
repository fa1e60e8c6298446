// pipe.json's reader refuses what it cannot trust, naming the field and the fix.
#include "stage/manifest.h"

#include <gtest/gtest.h>

#include <string>

namespace pipeforge::stage {
namespace {

std::string stageJson(const std::string& file) {
  return R"({"format": "pipeforge.pipe/1", "num_stages": 1, "inputs": ["x"],
             "outputs": [{"from": "stage", "stage": 0, "index": 0}],
             "stages": [{"index": 0, "file": ")" +
         file + R"(", "inputs": [{"from": "input", "index": 0}], "num_outputs": 1}]})";
}

std::string errorOf(const std::string& text) {
  try {
    manifestFromJson(text, "p.json");
  } catch (const ManifestError& e) {
    return e.what();
  }
  return "accepted";
}

// stageJson("stage_0.pt") with `fields` added at its top level.
std::string withFields(const std::string& fields) {
  std::string text = stageJson("stage_0.pt");
  text.insert(text.size() - 1, ", " + fields);
  return text;
}

TEST(Manifest, InputDimsAreRangesOnePerInput) {
  PipeManifest m = manifestFromJson(withFields(R"("input_dims": [[[1, 8], [3, null]]])"), "p.json");
  ASSERT_EQ(m.input_dims.size(), 1u);
  ASSERT_EQ(m.input_dims[0].size(), 2u);
  EXPECT_EQ(m.input_dims[0][0].min, 1);
  EXPECT_EQ(m.input_dims[0][0].max, 8);
  EXPECT_EQ(m.input_dims[0][1].min, 3);
  EXPECT_EQ(m.input_dims[0][1].max, -1) << "null: unbounded";
  EXPECT_EQ(errorOf(withFields(R"("input_dims": [[[1]]])")), "p.json: input_dims entries must be [min, max] pairs");
  EXPECT_EQ(errorOf(withFields(R"("input_dims": [[[4, 2]]])")),
            "p.json: input_dims has the range [4, 2]; re-run `pipeforge split`");
  EXPECT_EQ(errorOf(withFields(R"("input_dims": [])")),
            "p.json: input_dims lists 0 inputs but the model has 1; re-run `pipeforge split`");
}

TEST(Manifest, InputDtypesListEveryInputByName) {
  EXPECT_EQ(errorOf(withFields(R"("input_dtypes": ["float32", "float32"])")),
            "p.json: input_dtypes lists 2 inputs but the model has 1; re-run `pipeforge split`");
  const std::string e = errorOf(withFields(R"("input_dtypes": ["floaty"])"));
  EXPECT_EQ(e.rfind("p.json: input_dtypes has \"floaty\", which is not a dtype (", 0), 0u) << e;
}

TEST(Manifest, StageFormatIsTorchScriptOrPt2) {
  EXPECT_EQ(errorOf(withFields(R"("stage_format": "onnx")")),
            "p.json: stage_format is \"onnx\"; this version reads TorchScript stages (no stage_format) and \"pt2\"; "
            "re-run `pipeforge split` with this version");
  EXPECT_EQ(errorOf(withFields(R"("stage_format": "pt2")")),
            "p.json: stage_format is \"pt2\" but not every stage file ends in .pt2; re-run `pipeforge split`");
}

TEST(Manifest, StageEntriesAndCountsAgree) {
  std::string bad_digest = stageJson("stage_0.pt");
  bad_digest.insert(bad_digest.size() - 3, R"(, "sha256": "abc")");
  EXPECT_EQ(errorOf(bad_digest), "p.json: stage 0 has sha256 \"abc\", not 64 hex digits; re-run `pipeforge split`");
  std::string bad_xxh3 = stageJson("stage_0.pt");
  bad_xxh3.insert(bad_xxh3.size() - 3, R"(, "xxh3_128": "ABC")");
  EXPECT_EQ(errorOf(bad_xxh3), "p.json: stage 0 has xxh3_128 \"ABC\", not 32 hex digits; re-run `pipeforge split`");
  std::string two = stageJson("stage_0.pt");
  two.replace(two.find("\"num_stages\": 1"), 15, "\"num_stages\": 2");
  EXPECT_EQ(errorOf(two), "p.json: num_stages is 2 but 1 stages are listed");
  std::string renumbered = stageJson("stage_0.pt");
  renumbered.replace(renumbered.find("\"index\": 0, \"file\""), 10, "\"index\": 1");
  EXPECT_EQ(errorOf(renumbered), "p.json: stage at position 0 has index 1");
}

TEST(Manifest, StageFilesStayInsideTheSplitFolder) {
  EXPECT_EQ(manifestFromJson(stageJson("stage_0.pt"), "p.json").stages[0].file, "stage_0.pt");
  EXPECT_EQ(manifestFromJson(stageJson("sub/stage_0.pt"), "p.json").stages[0].file, "sub/stage_0.pt");
  EXPECT_EQ(manifestFromJson(stageJson("..stage_0.pt"), "p.json").stages[0].file, "..stage_0.pt");
  for (const char* bad : {"../stage_0.pt", "/etc/passwd", "a/../../b.pt", "..", ""}) {
    SCOPED_TRACE(bad);
    const std::string e = errorOf(stageJson(bad));
    EXPECT_NE(e.find("p.json: stage 0 names file \"" + std::string(bad) + "\""), std::string::npos) << e;
    EXPECT_NE(e.find("relative paths inside the split folder"), std::string::npos) << e;
  }
}

// Found by fuzz/manifest (fuzz/regressions/manifest/): floats where
// integers belong were truncated, or undefined behaviour when out of range.
TEST(Manifest, NumbersMustBeIntegersThatFit) {
  EXPECT_NE(errorOf(R"({"format": "pipeforge.pipe/1", "num_stages": 1e300, "inputs": [], "outputs": [],
                        "stages": [{"index": 0, "file": "s.pt", "inputs": [], "num_outputs": 0}]})")
                .find("'num_stages' must be an integer, got 1e+300"),
            std::string::npos);
  EXPECT_NE(errorOf(R"({"format": "pipeforge.pipe/1", "num_stages": 1, "inputs": ["x"],
                        "outputs": [{"from": "input", "index": -1e30}],
                        "stages": [{"index": 0, "file": "s.pt", "inputs": [], "num_outputs": 0}]})")
                .find("'index' must be an integer, got -1e+30"),
            std::string::npos);
  EXPECT_NE(errorOf(R"({"format": "pipeforge.pipe/1", "num_stages": 1.5, "inputs": [], "outputs": [],
                        "stages": []})")
                .find("'num_stages' must be an integer, got 1.5"),
            std::string::npos);
}

TEST(Manifest, RoundTripKeepsUnusedStateAndOlderFilesReadWithoutIt) {
  PipeManifest m = manifestFromJson(stageJson("stage_0.pt"), "p.json");
  EXPECT_TRUE(m.unused.empty()) << "a manifest written before \"unused\" existed";
  m.unused = {"aux.weight", "calib"};
  EXPECT_EQ(manifestFromJson(manifestToJson(m), "p.json"), m);
}

TEST(Manifest, ParameterMetaRoundTripsAndMustListEveryParameter) {
  PipeManifest m = manifestFromJson(stageJson("stage_0.pt"), "p.json");
  EXPECT_TRUE(m.stages[0].parameter_meta.empty()) << "a manifest written before \"parameter_meta\" existed";
  m.stages[0].parameters = {"fc.weight", "fc.bias"};
  m.stages[0].parameter_meta = {"float32[4, 8]", "float32[4]"};
  EXPECT_EQ(manifestFromJson(manifestToJson(m), "p.json"), m);
  m.stages[0].parameter_meta.pop_back();
  EXPECT_EQ(errorOf(manifestToJson(m)),
            "p.json: stage 0 has 1 parameter_meta entries for 2 parameters; re-run `pipeforge split`");
}

TEST(Manifest, ConstantInputsRoundTripAndOlderFilesReadWithoutThem) {
  PipeManifest m = manifestFromJson(stageJson("stage_0.pt"), "p.json");
  EXPECT_TRUE(m.constant_inputs.empty()) << "a manifest written before \"constant_inputs\" existed";
  m.constant_inputs = {{"scale", "2.0"}, {"use_bias", "true"}, {"sizes", "[2,3]"}, {"mode", "\"mean\""},
                       {"eps", "null"}};
  const std::string text = manifestToJson(m);
  EXPECT_NE(text.find("\"constant_inputs\": {"), std::string::npos) << text;
  EXPECT_EQ(manifestFromJson(text, "p.json"), m);
  std::string listed = stageJson("stage_0.pt");
  listed.insert(listed.size() - 1, R"(, "constant_inputs": [2.0])");
  EXPECT_NE(errorOf(listed).find("constant_inputs must map argument names to values"), std::string::npos)
      << errorOf(listed);
}

TEST(Manifest, InputMetaRoundTripsAndMustListEveryInput) {
  PipeManifest m = manifestFromJson(stageJson("stage_0.pt"), "p.json");
  EXPECT_TRUE(m.input_meta.empty()) << "a manifest written before \"input_meta\" existed";
  m.input_meta = {"int64[8, 128]"};
  const std::string text = manifestToJson(m);
  EXPECT_NE(text.find("\"input_meta\": ["), std::string::npos) << text;
  EXPECT_EQ(manifestFromJson(text, "p.json"), m);
  std::string two = stageJson("stage_0.pt");
  two.insert(two.size() - 1, R"(, "input_meta": ["int64[8]", "int64[8]"])");
  EXPECT_NE(errorOf(two).find("input_meta lists 2 inputs but the model has 1; re-run `pipeforge split`"),
            std::string::npos)
      << errorOf(two);
}

}  // namespace
}  // namespace pipeforge::stage
