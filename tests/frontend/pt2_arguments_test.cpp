// PT2 Arguments as TorchScript values: each kind becomes the constant or
// list TorchScript's schema matching expects, and what cannot is refused.
#include "frontend/pt2_arguments.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>

#include <cmath>
#include <memory>

#include "frontend/errors.h"

namespace pipeforge::frontend {
namespace {

using json = nlohmann::ordered_json;
using torch::jit::Value;

class Pt2Arguments : public ::testing::Test {
 protected:
  Pt2Arguments()
      : graph_(std::make_shared<torch::jit::Graph>()), x_(graph_->addInput("x")), n_(graph_->addInput("n")) {
    x_->setType(c10::TensorType::get());
    n_->setType(c10::IntType::get());
    scope_.graph = graph_.get();
    scope_.resolve = [this](const std::string& name) -> Value* {
      if (name == "x") return x_;
      if (name == "n") return n_;
      throw Pt2Error("no value '" + name + "'");
    };
    scope_.source = "m.pt2";
  }

  Value* read(const std::string& arg_json) { return readPt2Argument(scope_, json::parse(arg_json), "node 'n' (t)"); }

  // The constant an argument became.
  c10::IValue constant(const std::string& arg_json) {
    auto value = torch::jit::toIValue(read(arg_json));
    EXPECT_TRUE(value.has_value()) << arg_json << " is not a constant";
    return value.value_or(c10::IValue());
  }

  std::string error(const std::string& arg_json) {
    try {
      read(arg_json);
    } catch (const Pt2Error& e) {
      return e.what();
    }
    return "<no error>";
  }

  std::shared_ptr<torch::jit::Graph> graph_;
  Value* x_;  // a tensor
  Value* n_;  // a symbolic int
  Pt2ArgumentScope scope_;
};

TEST_F(Pt2Arguments, ScalarsBecomeConstants) {
  EXPECT_TRUE(constant(R"({"as_none": ""})").isNone());
  EXPECT_EQ(constant(R"({"as_int": 5})").toInt(), 5);
  EXPECT_EQ(constant(R"({"as_float": 0.5})").toDouble(), 0.5);
  EXPECT_EQ(constant(R"({"as_float": "-Infinity"})").toDouble(), -std::numeric_limits<double>::infinity());
  EXPECT_EQ(constant(R"({"as_bool": true})").toBool(), true);
  EXPECT_EQ(constant(R"({"as_string": "tanh"})").toStringRef(), "tanh");
  EXPECT_EQ(constant(R"({"as_device": {"type": "cpu", "index": 0}})").toDevice(), c10::Device("cpu:0"));
  EXPECT_EQ(constant(R"({"as_device": {"type": "cpu", "index": null}})").toDevice(), c10::Device("cpu"));
  EXPECT_EQ(constant(R"({"as_complex": {"real": 1.0, "imag": "NaN"}})").toComplexDouble().real(), 1.0);
}

TEST_F(Pt2Arguments, SchemaEnumCodesBecomeC10s) {
  // The schema's float32 is 7, c10's 6; its channels_last 2, c10's 2; its strided 7, c10's 0.
  EXPECT_EQ(constant(R"({"as_scalar_type": 7})").toInt(), static_cast<int64_t>(c10::ScalarType::Float));
  EXPECT_EQ(constant(R"({"as_scalar_type": 5})").toInt(), static_cast<int64_t>(c10::ScalarType::Long));
  EXPECT_EQ(constant(R"({"as_memory_format": 4})").toInt(), static_cast<int64_t>(c10::MemoryFormat::Preserve));
  EXPECT_EQ(constant(R"({"as_layout": 7})").toInt(), static_cast<int64_t>(c10::kStrided));
}

TEST_F(Pt2Arguments, ConstantListsKeepTheirElements) {
  EXPECT_EQ(constant(R"({"as_ints": [1, -2]})").toIntVector(), (std::vector<int64_t>{1, -2}));
  EXPECT_EQ(constant(R"({"as_floats": [0.5, "inf"]})").toDoubleVector(),
            (std::vector<double>{0.5, std::numeric_limits<double>::infinity()}));
  EXPECT_EQ(constant(R"({"as_bools": [true, false]})").toBoolList().vec(), (std::vector<bool>{true, false}));
  auto strings = constant(R"({"as_strings": ["a", "b"]})").toList();
  ASSERT_EQ(strings.size(), 2u);
  EXPECT_EQ(strings.get(1).toStringRef(), "b");
}

TEST_F(Pt2Arguments, NamesAreResolvedByTheCaller) {
  EXPECT_EQ(read(R"({"as_tensor": {"name": "x"}})"), x_);
  EXPECT_EQ(read(R"({"as_optional_tensor": {"as_tensor": {"name": "x"}}})"), x_);
  EXPECT_TRUE(constant(R"({"as_optional_tensor": {"as_none": true}})").isNone());
  EXPECT_EQ(read(R"({"as_sym_int": {"as_name": "n"}})"), n_);
  EXPECT_EQ(constant(R"({"as_sym_int": {"as_int": 4}})").toInt(), 4);

  Value* sizes = read(R"({"as_sym_ints": [{"as_name": "n"}, {"as_int": 3}]})");
  ASSERT_EQ(sizes->node()->kind(), c10::prim::ListConstruct);
  EXPECT_EQ(sizes->type()->str(), "int[]");
  ASSERT_EQ(sizes->node()->inputs().size(), 2u);
  EXPECT_EQ(sizes->node()->input(0), n_);
  EXPECT_EQ(torch::jit::toIValue(sizes->node()->input(1))->toInt(), 3);

  Value* tensors = read(R"({"as_optional_tensors": [{"as_tensor": {"name": "x"}}, {"as_none": true}]})");
  ASSERT_EQ(tensors->node()->kind(), c10::prim::ListConstruct);
  EXPECT_EQ(tensors->type()->str(), "Tensor?[]");
  EXPECT_EQ(tensors->node()->input(0), x_);
}

TEST_F(Pt2Arguments, ErrorsNameTheFileAndTheNode) {
  EXPECT_EQ(error(R"({"as_int": 1, "as_bool": true})"),
            R"('m.pt2': node 'n' (t): malformed argument {"as_int":1,"as_bool":true})");
  EXPECT_EQ(error(R"({"as_graph": {}})"),
            "'m.pt2': node 'n' (t): argument kind 'as_graph' cannot be expressed in TorchScript; export without it");
  EXPECT_EQ(error(R"({"as_memory_format": 9})"), "'m.pt2': node 'n' (t): unknown memory format code 9");
  EXPECT_EQ(error(R"({"as_layout": 0})"), "'m.pt2': node 'n' (t): unknown layout code 0");
  EXPECT_EQ(error(R"({"as_sym_int": {"as_what": 1}})"), R"('m.pt2': unknown symbolic value {"as_what":1})");
  EXPECT_EQ(error(R"({"as_tensor": {"name": "y"}})"), "no value 'y'");
  EXPECT_EQ(error(R"({"as_float": "many"})"), "float argument 'many' is not a number");
}

}  // namespace
}  // namespace pipeforge::frontend
