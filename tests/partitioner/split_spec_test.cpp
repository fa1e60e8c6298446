// Split-spec parsing: every key, and errors naming the key and line.
#include <gtest/gtest.h>

#include "partitioner/split_spec.h"

namespace pipeforge::partitioner {
namespace {

TEST(SplitSpec, ParsesEveryKey) {
  auto spec = parseSplitSpec(
      "split_points:\n  layers.1: BEGINNING\n  lm: END\nnum_stages: 3\npolicy: cost\n"
      "example_inputs:\n  - {shape: [8, 4], dtype: int64, high: 10}\n",
      "t.yaml");
  ASSERT_EQ(spec.split_points.size(), 2u);
  EXPECT_EQ(spec.split_points[0].first, "layers.1");
  EXPECT_EQ(spec.split_points[0].second, SplitPoint::kBeginning);
  EXPECT_EQ(spec.split_points[1].second, SplitPoint::kEnd);
  EXPECT_EQ(spec.num_stages, 3);
  EXPECT_EQ(spec.policy, Policy::kCost);
  ASSERT_EQ(spec.example_inputs.size(), 1u);
  EXPECT_EQ(spec.example_inputs[0].shape, (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(spec.example_inputs[0].dtype, "int64");
  EXPECT_EQ(spec.example_inputs[0].high, 10);
}

TEST(SplitSpec, ExampleInputDtypesTakePyTorchNames) {
  auto spec = parseSplitSpec(
      "example_inputs:\n  - {shape: [2], dtype: long}\n  - {shape: [2], dtype: torch.float32}\n"
      "  - {shape: [2], dtype: half}\n",
      "t.yaml");
  ASSERT_EQ(spec.example_inputs.size(), 3u);
  EXPECT_EQ(spec.example_inputs[0].dtype, "int64");
  EXPECT_EQ(spec.example_inputs[1].dtype, "float32");
  EXPECT_EQ(spec.example_inputs[2].dtype, "float16");
}

TEST(SplitSpec, ConstantInputsKeepTheirTextUntilTheModelGivesTypes) {
  auto spec = parseSplitSpec(
      "constant_inputs:\n  scale: 2.0\n  mode: mean\n  sizes: [2, 3]\n  eps: null\n  empty: []\n", "t.yaml");
  ASSERT_EQ(spec.constant_inputs.size(), 5u);
  const auto& c = spec.constant_inputs;
  EXPECT_EQ(c[0].name, "scale");
  EXPECT_EQ(c[0].kind, ConstantInput::Kind::kScalar);
  EXPECT_EQ(c[0].items, std::vector<std::string>{"2.0"});
  EXPECT_EQ(c[0].where, "t.yaml:2");
  EXPECT_EQ(c[1].items, std::vector<std::string>{"mean"});
  EXPECT_EQ(c[2].kind, ConstantInput::Kind::kList);
  EXPECT_EQ(c[2].items, (std::vector<std::string>{"2", "3"}));
  EXPECT_EQ(c[3].kind, ConstantInput::Kind::kNull);
  EXPECT_EQ(c[4].kind, ConstantInput::Kind::kList);
  EXPECT_TRUE(c[4].items.empty());
  EXPECT_TRUE(parseSplitSpec("constant_inputs:\n", "t.yaml").constant_inputs.empty());
}

TEST(SplitSpec, ErrorsNameTheKeyAndLine) {
  struct Case {
    std::string yaml;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {"num_stages: two", "t.yaml:1: 'num_stages' must be an integer"},
      {"num_stages: 0", "num_stages must be >= 1"},
      {"policy: uniform", "policy 'uniform' needs num_stages"},
      {"num_stages: 2\npolicy: cost", "needs example_inputs"},
      {"example_inputs: [{dtype: int64}]", "needs a shape"},
      {"example_inputs: [{shape: [2], dtype: complex}]", "dtype 'complex' is not supported"},
      {"example_inputs: [{shape: [2], size: 3}]", "unknown key 'example_inputs[0].size'"},
      {"split_points: [a, b]", "split_points must map FQNs"},
      {"- just\n- a list", "a split spec is a YAML map"},
      // Found by fuzz/split_spec (fuzz/regressions/split_spec/): keys that are lists or maps.
      {"? [a, b]\n: 1\n", "t.yaml:1: a key must be a name such as num_stages or layers.1, got a list"},
      {"example_inputs:\n  - {? [shape]: [2]}\n", "t.yaml:2: a key must be a name"},
      {"split_points:\n  ? {layers.1: x}\n  : END\n", "t.yaml:2: a key must be a name such as num_stages or layers.1, got a map"},
      {"? ample_inputs:\n  - {shape: [8]}\n", "got a map"},
      // constant_inputs: the shape of the values; their types are checked against forward at split time.
      {"constant_inputs: [1, 2]", "t.yaml:1: constant_inputs must map forward's non-tensor arguments to values"},
      {"constant_inputs:\n  scale: {a: 1}\n", "t.yaml:2: constant_inputs.scale must be an int, float, bool, string"},
      {"constant_inputs: {sizes: [[1], 2]}", "constant_inputs.sizes must be a list of numbers, e.g. [2, 3]"},
      {"constant_inputs: {1x: 2}", "constant_inputs.1x: '1x' is not an argument name"},
      {"constant_inputs: {scale: 1, scale: 2}", "t.yaml:1: 'constant_inputs.scale' appears twice (first at line 1); keep one"},
      // yaml-cpp keeps a repeated key and a reader would take the last one.
      {"num_stages: 2\npolicy: parameters\nnum_stages: 3\n", "t.yaml:3: 'num_stages' appears twice (first at line 1); keep one"},
      {"constant_input: {scale: 1}", "unknown key 'constant_input'; a split spec takes split_points, num_stages, "
                                     "policy, example_inputs and constant_inputs"},
  };
  for (const auto& c : cases) {
    try {
      parseSplitSpec(c.yaml, "t.yaml");
      ADD_FAILURE() << "accepted: " << c.yaml;
    } catch (const SpecError& e) {
      EXPECT_NE(std::string(e.what()).find(c.fragment), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace pipeforge::partitioner
