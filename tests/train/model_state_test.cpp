// The model_state records (train/model_state.h): after the first update,
// every rank's bytes of parameters, gradients and optimizer state, against
// what its stages hold by pipe.json: 16 bytes per parameter for fp32 AdamW,
// 12 for SGD with momentum, with no sharding.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "stage/manifest.h"
#include "stage/value_meta.h"
#include "tests/support/zoo.h"
#include "tests/train/train_fixture.h"

namespace pipeforge::testing {
namespace {

// Elements of every parameter on each pipeline rank (stage s on rank s % ranks), by pipe.json.
std::map<int, std::int64_t> parametersByRank(const std::string& split_dir, int ranks) {
  const stage::PipeManifest m = stage::readManifest(split_dir);
  std::map<int, std::int64_t> out;
  for (const auto& s : m.stages) {
    EXPECT_EQ(s.parameter_meta.size(), s.parameters.size()) << "stage " << s.index;
    for (const auto& meta : s.parameter_meta) {
      const auto parsed = stage::parseValueMeta(meta);
      EXPECT_TRUE(parsed.has_value()) << meta;
      if (!parsed) continue;
      std::int64_t n = 1;
      for (std::int64_t d : parsed->shape) n *= d;
      out[s.index % ranks] += n;
    }
  }
  return out;
}

std::vector<nlohmann::json> modelStateRecords(const std::string& metrics) {
  std::ifstream in(metrics);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    if (j.value("event", "") == "model_state") out.push_back(j);
  }
  return out;
}

struct StateCase {
  const char* name;
  const char* optimizer;
  std::int64_t optimizer_bytes_per_parameter;
};

class ModelState : public ::testing::TestWithParam<StateCase> {};

TEST_P(ModelState, EveryRankReportsWhatItsStagesHold) {
  const StateCase& c = GetParam();
  TrainWorkspace ws;
  RunSpec s;
  s.split = "num_stages: 2\n  policy: parameters";
  s.optimizer = c.optimizer;
  const std::string config = ws.writeConfig(c.name, s);
  auto run = runPipeforge(fmt::format("train --config '{}' --nproc 2", config));
  ASSERT_EQ(run.exit_code, 0) << run.output;

  const auto records = modelStateRecords(ws.outDir(c.name) + "/metrics.jsonl");
  ASSERT_EQ(records.size(), 2u) << run.output;
  const auto expected = parametersByRank(ws.outDir(c.name) + "/stages", 2);
  for (const auto& r : records) {
    const int rank = r.at("rank").get<int>();
    const std::int64_t n = expected.at(rank);
    EXPECT_EQ(r.at("parameters").get<std::int64_t>(), n) << r.dump();
    EXPECT_EQ(r.at("param_bytes").get<std::int64_t>(), 4 * n) << r.dump();
    EXPECT_EQ(r.at("grad_bytes").get<std::int64_t>(), 4 * n) << r.dump();
    EXPECT_EQ(r.at("optimizer_bytes").get<std::int64_t>(), c.optimizer_bytes_per_parameter * n) << r.dump();
    EXPECT_DOUBLE_EQ(r.at("bytes_per_parameter").get<double>(), 8.0 + c.optimizer_bytes_per_parameter);
    EXPECT_NE(run.output.find(fmt::format("model state rank {}: ", rank)), std::string::npos) << run.output;
  }
}

INSTANTIATE_TEST_SUITE_P(Train, ModelState,
                         ::testing::Values(StateCase{"adamw", "{name: adamw, lr: 1.0e-3}", 8},
                                           StateCase{"sgd_momentum", "{name: sgd, lr: 0.01, momentum: 0.9}", 4}),
                         [](const ::testing::TestParamInfo<StateCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace pipeforge::testing
