// Writes the split folders the runtime tests use, with the real splitter
// (stage::splitModelToDirectory): <out>/<model>_<stages> for the zoo's mlp,
// gpt, gpt_dropout (in 2 and 4 stages) and multi_io, cut by the `uniform` policy.
//
// multi_io has six submodules, so no split cuts it into eight stages; that
// one folder comes from make_splits.py (hand-written stages) instead.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "stage/split_model.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: make_real_splits OUT_ROOT ZOO_DIR\n";
    return 2;
  }
  std::string out = argv[1], zoo = argv[2];
  struct Model {
    const char* name;
    const char* example;
    std::vector<int> stages;
  };
  const std::vector<Model> models = {
      {"mlp", "[{shape: [8, 8]}]", {1, 2, 4, 8}},
      {"gpt", "[{shape: [4, 16], dtype: int64, high: 64}]", {1, 2, 4, 8}},
      {"gpt_dropout", "[{shape: [4, 16], dtype: int64, high: 64}]", {2, 4}},
      {"multi_io", "[{shape: [6, 8]}, {shape: [6, 8]}, {shape: [6, 8], dtype: int64, high: 2}]", {1, 2, 4}},
  };
  try {
    std::filesystem::create_directories(out);
    for (const Model& m : models) {
      for (int n : m.stages) {
        std::string spec = fmt::format("{}/{}_{}.yaml", out, m.name, n);
        std::ofstream(spec) << fmt::format("num_stages: {}\npolicy: uniform\nexample_inputs: {}\n", n, m.example);
        pipeforge::stage::SplitRequest req;
        req.model_path = fmt::format("{}/{}.pt", zoo, m.name);
        req.spec_path = spec;
        req.out_dir = fmt::format("{}/{}_{}", out, m.name, n);
        req.force = true;
        auto summary = pipeforge::stage::splitModelToDirectory(req);
        if (summary.manifest.num_stages != n) {
          std::cerr << req.out_dir << ": asked for " << n << " stages, got " << summary.manifest.num_stages << "\n";
          return 1;
        }
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "make_real_splits: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
