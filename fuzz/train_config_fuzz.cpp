// Fuzzes the training-config YAML reader (config/train_config.h): any text
// either parses or throws ConfigError (split-spec and schedule problems are
// wrapped into ConfigError too); yaml-cpp's exceptions must not escape. A
// config that parses then goes through checkLayout for a few world sizes.
//
// The reader checks that the files it names exist, so the target runs in a
// scratch folder holding the files the seeds name (fuzz/corpus/train_config):
//   model.pt, data.bin, val.bin, split.yaml (a valid split spec),
//   bad_split.yaml (an invalid one) and split/pipe.json.
// Relative paths on the command line (corpus folders, inputs, -dict=,
// -artifact_prefix=, ...) are made absolute before it changes folder.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <system_error>
#include <vector>

#include "config/train_config.h"
#include "fuzz/fuzz_support.h"

namespace {

namespace pf = pipeforge;
namespace fs = std::filesystem;
using pf::train::ConfigError;
constexpr const char* kTarget = "train_config";

void writeFile(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// Schedules grow with microbatches x stages; past this the layout check would
// measure the generators' speed, not the reader.
constexpr std::int64_t kMaxLayoutWork = 256;

void checkLayout(const pf::train::TrainConfig& config, std::int64_t world_size, std::int64_t num_stages) {
  if (world_size > std::numeric_limits<int>::max() || num_stages > std::numeric_limits<int>::max()) return;
  try {
    pf::train::checkLayout(config, static_cast<int>(world_size), static_cast<int>(num_stages));
    (void)pf::train::replicaBatchSize(config);
  } catch (const ConfigError& e) {
    pf::fuzz::noteRejected(kTarget, e);
  } catch (...) {
    pf::fuzz::failOnUndocumentedException(kTarget, "checkLayout");
  }
}

// checkLayout for 1-4 pipeline ranks: with a split of as many stages as the
// ranks (a mismatch unless stages_per_rank is 1), a world that data_parallel
// does not divide, and, when the schedule is small, the matching split.
void checkLayouts(const pf::train::TrainConfig& config) {
  const auto& p = config.pipeline;
  if (p.data_parallel < 1 || p.stages_per_rank < 1 || p.microbatches < 1) {
    pf::fuzz::failProperty(kTarget, "a pipeline size below 1 was accepted");
  }
  const bool small = static_cast<std::int64_t>(p.microbatches) * p.stages_per_rank <= kMaxLayoutWork;
  for (std::int64_t ranks = 1; ranks <= 4; ++ranks) {
    const std::int64_t world = ranks * p.data_parallel;
    if (p.stages_per_rank != 1 || small) checkLayout(config, world, ranks);
    checkLayout(config, world + 1, ranks * p.stages_per_rank);
    if (small) checkLayout(config, world, ranks * p.stages_per_rank);
  }
}

// libFuzzer flags whose value is a path.
bool isPathFlag(const std::string& name) {
  return name == "dict" || name == "artifact_prefix" || name == "exact_artifact_path" ||
         name == "merge_control_file" || name == "features_dir" || name == "data_flow_trace";
}

// Rewrites argv so it still names the same files once the working folder changes.
void makePathArgumentsAbsolute(int* argc, char*** argv) {
  static std::vector<std::string> storage;
  static std::vector<char*> pointers;
  storage.assign(*argv, *argv + *argc);
  // argv[0] stays: libFuzzer refuses a changed one. -minimize_crash, -fork and
  // -merge start the binary again by that name, so give them an absolute path.
  for (std::size_t i = 1; i < storage.size(); ++i) {
    std::string& arg = storage[i];
    if (arg.empty()) continue;
    if (arg[0] != '-') {
      arg = fs::absolute(arg).string();
      continue;
    }
    const auto eq = arg.find('=');
    if (eq == std::string::npos) continue;
    const std::string name = arg.substr(1, eq - 1);
    const std::string value = arg.substr(eq + 1);
    if (isPathFlag(name) && !value.empty()) {
      arg = "-" + name + "=" + fs::absolute(value).string();
    }
  }
  pointers.clear();
  for (auto& arg : storage) pointers.push_back(arg.data());
  pointers.push_back(nullptr);
  *argv = pointers.data();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  makePathArgumentsAbsolute(argc, argv);
  char scratch[] = "/tmp/pipeforge-fuzz-train-XXXXXX";
  if (!mkdtemp(scratch)) {
    std::perror("pipeforge-fuzz: mkdtemp");
    std::abort();
  }
  const fs::path dir = scratch;
  writeFile(dir / "model.pt", "not a model; the reader only checks that it exists\n");
  writeFile(dir / "data.bin", std::string(256, 'a'));
  writeFile(dir / "val.bin", std::string(64, 'b'));
  writeFile(dir / "split.yaml", "split_points:\n  layers.1: BEGINNING\nnum_stages: 2\npolicy: parameters\n");
  writeFile(dir / "bad_split.yaml", "policy: uniform\n");
  fs::create_directory(dir / "split");
  writeFile(dir / "split" / "pipe.json", "{}\n");
  fs::current_path(dir);
  // The folder goes when the fuzzer exits normally; a crash leaves it in /tmp.
  static const std::string kScratch = scratch;
  std::atexit([] {
    std::error_code ec;
    fs::remove_all(kScratch, ec);
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text = pf::fuzz::textOf(data, size);
  pf::train::TrainConfig config;
  try {
    config = pf::train::parseTrainConfig(text, "fuzz/train.yaml");
  } catch (const ConfigError& e) {
    pf::fuzz::noteRejected(kTarget, e);
    return 0;
  } catch (...) {
    pf::fuzz::failOnUndocumentedException(kTarget, "parseTrainConfig");
  }
  pf::fuzz::noteAccepted(kTarget);
  checkLayouts(config);
  return 0;
}
