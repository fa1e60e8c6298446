// Split benchmark: split + write time of GPT models as a ratio to
// torch::jit::load of the same file in the same run, and the balance each
// policy reaches. Usage: pipeforge_bench_split MODEL.pt [MODEL.pt ...]
#include <fmt/format.h>
#include <ATen/Parallel.h>
#include <torch/script.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "frontend/load_model.h"
#include "partitioner/split_spec.h"
#include "stage/split_in_memory.h"
#include "stage/split_model.h"

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

template <typename F>
double bestOf(int reps, F&& f) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto start = Clock::now();
    f();
    best = std::min(best, secondsSince(start));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  at::set_num_threads(1);
  fs::path scratch = fs::temp_directory_path() / "pipeforge-split-bench";
  fs::create_directories(scratch);
  std::string spec_path = (scratch / "spec.yaml").string();
  std::ofstream(spec_path) << "num_stages: 4\npolicy: parameters\n";

  fmt::print("{:<28} {:>10} {:>12} {:>8}\n", "model", "load s", "split+write s", "ratio");
  for (int i = 1; i < argc; ++i) {
    std::string model = argv[i];
    double load = bestOf(3, [&] { torch::jit::load(model); });
    double split = bestOf(3, [&] {
      pipeforge::stage::SplitRequest request;
      request.model_path = model;
      request.spec_path = spec_path;
      request.out_dir = (scratch / "out").string();
      request.force = true;
      pipeforge::stage::splitModelToDirectory(request);
    });
    fmt::print("{:<28} {:>10.3f} {:>12.3f} {:>8.2f}\n", fs::path(model).filename().string(), load, split, split / load);
  }

  fmt::print("\nbalance (max/mean stage weight) per policy\n");
  for (int i = 1; i < argc; ++i) {
    auto module = pipeforge::frontend::loadModel(argv[i]);
    for (const char* policy : {"parameters", "uniform", "cost"}) {
      for (int stages : {2, 4, 8}) {
        auto spec = pipeforge::partitioner::parseSplitSpec(
            fmt::format("num_stages: {}\npolicy: {}\nexample_inputs: [{{shape: [4, 16], dtype: int64, high: 64}}]\n",
                        stages, policy),
            "bench");
        auto result = pipeforge::stage::splitInMemory(module, spec);
        fmt::print("{:<28} {}\n", fs::path(argv[i]).filename().string(), result.partition.balance);
      }
    }
  }
  fs::remove_all(scratch);
  return 0;
}
