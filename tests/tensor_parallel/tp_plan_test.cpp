// Tensor parallel planned from the graph on the TorchScript zoo (both
// builds): a scripted MLP splits into alternating column and row linears and
// its ranks compute the whole model; a fused projection is refused.
#include <gtest/gtest.h>
#include <torch/script.h>

#include "tensor_parallel/tp_plan.h"
#include "tests/support/build_paths.h"
#include "tests/tensor_parallel/tp_ranks.h"

namespace pipeforge::tensor_parallel {
namespace {

torch::jit::Module zoo(const std::string& name) { return torch::jit::load(std::string(PIPEFORGE_ZOO_DIR) + "/" + name + ".pt"); }

std::vector<at::Tensor> features() {
  at::manual_seed(5);
  return {at::randn({8, 8})};
}

TEST(TpPlan, MlpAlternatesColumnsAndRows) {
  // h = relu(inp(x)); h = h + relu(fc2(relu(fc1(h)))) six times; out(h).
  TpPlan plan = planTensorParallel(zoo("mlp"), features(), 2);
  std::map<std::string, std::string> expected = {{"inp", "colwise"}, {"out", "rowwise"}};
  for (int b = 0; b < 6; ++b) {
    expected["blocks." + std::to_string(b) + ".fc1"] = "rowwise";
    expected["blocks." + std::to_string(b) + ".fc2"] = "colwise";
  }
  EXPECT_EQ(plan.styles(), expected) << plan.describe();
  EXPECT_EQ(plan.reduces, 7);
}

TEST(TpPlan, MlpRanksComputeTheWholeModel) {
  for (int t : {2, 4}) {
    SCOPED_TRACE("tensor_parallel " + std::to_string(t));
    EXPECT_EQ(testing::compareWithWhole([] { return zoo("mlp"); }, features(), t), 2 + 6 * 3 + 1);
  }
}

TEST(TpPlan, DegreeOneSplitsNothing) {
  TpPlan plan = planTensorParallel(zoo("mlp"), features(), 1);
  EXPECT_TRUE(plan.parameters.empty());
  EXPECT_TRUE(plan.styles().empty());
  EXPECT_THROW(planTensorParallel(zoo("mlp"), features(), 0), TpPlanError);
}

TEST(TpPlan, FusedProjectionIsRefused) {
  // The zoo GPT's attention computes q, k and v in one Linear, then splits them.
  at::manual_seed(3);
  try {
    planTensorParallel(zoo("gpt"), {at::randint(0, 64, {2, 16})}, 2);
    ADD_FAILURE() << "planned without an error";
  } catch (const TpPlanError& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("blocks.0.attn"), std::string::npos) << message;
    EXPECT_NE(message.find("fused"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace pipeforge::tensor_parallel
