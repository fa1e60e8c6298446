// Every bad config or command line gets one clear message naming the key,
// a non-zero exit, and no crash, through the `pipeforge train` binary.
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <regex>
#include <thread>

#include <fmt/format.h>

#include "tests/train/train_fixture.h"

namespace pipeforge::testing {
namespace {

struct BadRun {
  const char* name;
  std::string from, to;  // replaced in the valid config ("" from: appended)
  int nproc = 2;
  std::vector<std::string> expected;
  std::string from2 = "", to2 = "";  // a second replacement
};

TEST(TrainCliErrors, EveryMistakeIsNamed) {
  TrainWorkspace ws;
  RunSpec s;
  s.split = "num_stages: 2\n  policy: parameters";
  const std::string valid_path = ws.writeConfig("valid", s);
  std::ifstream in(valid_path);
  const std::string valid((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  const std::vector<BadRun> cases = {
      {"missing config", "", "", 2, {"training config", "cannot be read"}},
      {"malformed yaml", "", "optimizer: [\n", 2, {"'[' is never closed; close it with ']'"}},
      {"tab in the indentation", "", "checkpoint:\n\tevery: 2\n", 2,
       {"a tab in the indentation; YAML indents with spaces"}},
      {"unknown top key", "", "optimiser: {lr: 1}\n", 2, {"unknown key 'optimiser'"}},
      {"unknown nested key", "weight_decay: 0.01}", "weight_decay: 0.01, betaz: [0.9, 0.9]}", 2,
       {"unknown key 'optimizer.betaz'", "betas"}},
      {"wrong type", "steps: 3,", "steps: three,", 2, {"training.steps must be an integer >= 1", "'three'"}},
      // yaml-cpp keeps both, and the later would win silently (issue 24.4).
      {"repeated key", "steps: 3,", "steps: 3, steps: 2,", 2, {"'training.steps' appears twice", "keep one"}},
      {"negative lr", "lr: 1.0e-3", "lr: -1", 2, {"optimizer.lr must be a number > 0"}},
      {"missing data file", "tokens.bin", "nope.bin", 2, {"data.path", "nope.bin", "does not exist"}},
      {"missing model", "zoo/gpt.pt", "zoo/nope.pt", 2, {"model.path", "does not exist"}},
      {"data of the wrong form", "format: tokens", "format: tensors", 2, {"data.path", "not a zip archive"},
       ", block_size: 16", ""},
      {"batch vs microbatches", "microbatches: 4", "microbatches: 3", 2,
       {"training.global_batch_size 8", "pipeline.microbatches 3"}},
      {"batch vs data parallel", "data_parallel: 1", "data_parallel: 3", 3, {"pipeline.data_parallel 3"}},
      {"more ranks than stages", "", "", 4,
       {"4 ranks make 4 pipeline ranks", "need 4 stages, but the split has 2", "model.num_stages: 4",
        "run 2 ranks (--nproc 2)", "pipeline.data_parallel: 2"}},
      {"world vs data parallel", "data_parallel: 1", "data_parallel: 2", 3,
       {"3 ranks cannot hold pipeline.data_parallel 2"}},
      {"schedule needs two stages per rank", "schedule: 1F1B", "schedule: ZBVZeroBubble", 2,
       {"pipeline.schedule ZBVZeroBubble"}},
      {"unknown schedule", "schedule: 1F1B", "schedule: 3F3B", 2, {"pipeline.schedule '3F3B'", "GPipe"}},
      {"mse on tokens", "loss: cross_entropy", "loss: mse", 2, {"loss mse", "cross_entropy"}},
      {"bad split policy", "policy: parameters", "policy: fastest", 2, {"model", "unknown policy 'fastest'"}},
      {"bad checkpoint interval", "every: 0", "every: often", 2, {"checkpoint.every must be an integer"}},
      {"device this host lacks", "", "distributed: {device: 'cuda:7'}\n", 2, {"distributed.device cuda:7"},
       "distributed: {timeout_s: 60}", ""},
      {"block too long for the data", "block_size: 16", "block_size: 5000", 2, {"data.block_size 5000"}},
  };

  std::vector<testing::CommandResult> results(cases.size());
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < 3; ++t) {
    pool.emplace_back([&] {
      for (std::size_t k = next++; k < cases.size(); k = next++) {
        const BadRun& c = cases[k];
        std::string path = ws.dir() + fmt::format("/bad{}.yaml", k);
        if (std::string(c.name) == "missing config") {
          path = ws.dir() + "/no-such-config.yaml";
        } else {
          std::string text = valid;
          if (c.from.empty()) {
            text += c.to;
          } else if (text.find(c.from) != std::string::npos) {
            text.replace(text.find(c.from), c.from.size(), c.to);
          } else {
            text = "# '" + c.from + "' not found in the valid config\n";
          }
          if (!c.from2.empty() && text.find(c.from2) != std::string::npos) {
            text.replace(text.find(c.from2), c.from2.size(), c.to2);
          }
          // Folders of its own: cases run side by side, and a run holds its
          // folders (Note [One run per folder]).
          const std::string out = ws.outDir("valid"), own = fmt::format("{}/case{}", ws.dir(), k);
          for (auto at = text.find(out); at != std::string::npos; at = text.find(out, at + own.size())) {
            text.replace(at, out.size(), own);
          }
          std::ofstream(path) << text;
        }
        results[k] = runPipeforge(fmt::format("train --config '{}' --nproc {}", path, c.nproc));
      }
    });
  }
  for (auto& t : pool) t.join();

  for (std::size_t k = 0; k < cases.size(); ++k) {
    const BadRun& c = cases[k];
    const auto& r = results[k];
    SCOPED_TRACE(c.name);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    for (const auto& fragment : c.expected) {
      EXPECT_NE(r.output.find(fragment), std::string::npos) << "missing '" << fragment << "' in:\n" << r.output;
    }
    EXPECT_NE(r.output.find("pipeforge train: error: "), std::string::npos) << r.output;
    for (const char* crash : {"terminate called", "Exception raised from", "INTERNAL ASSERT", "Segmentation"}) {
      EXPECT_EQ(r.output.find(crash), std::string::npos) << r.output;
    }
    // Refused before any rank started: one error, no rank output.
    EXPECT_EQ(r.output.find("rank 0"), std::string::npos) << r.output;
    // The spec fixes 2 stages, so the layout is refused before the split
    // (which prints "split MODEL into DIR").
    if (std::string(c.name) == "more ranks than stages") EXPECT_EQ(r.output.find(".pt into "), std::string::npos);
  }
}

// Issue 39 item 4: every way out the layout refusal names works as written,
// for a config that splits inline and one that uses model.split_spec; and an
// inline split key given by --set beside model.split_spec is named as the
// override it is, not as a line of the file.
TEST(TrainCliErrors, TheLayoutRefusalsFixesWork) {
  TrainWorkspace ws;
  RunSpec s;
  s.split = "num_stages: 2\n  policy: parameters";
  s.steps = 1;
  const std::string inline_config = ws.writeConfig("inline", s);
  const std::string spec = ws.dir() + "/split.yaml";
  std::ofstream(spec) << "num_stages: 2\npolicy: parameters\n";
  s.split = fmt::format("split_spec: {}", spec);
  const std::string spec_config = ws.writeConfig("spec", s);

  auto train = [&](const std::string& config, const std::string& args) {
    return runPipeforge(fmt::format("train --config '{}' {}", config, args));
  };
  auto expect_refused = [](const CommandResult& r, const std::vector<std::string>& fragments) {
    EXPECT_EQ(r.exit_code, 1) << r.output;
    for (const auto& f : fragments) EXPECT_NE(r.output.find(f), std::string::npos) << f << " in:\n" << r.output;
  };
  auto expect_trains = [](const CommandResult& r, const std::string& fix) {
    EXPECT_EQ(r.exit_code, 0) << "the fix '" << fix << "' failed:\n" << r.output;
  };

  // The spec file's config: the split fix names the file, and each fix works.
  expect_refused(train(spec_config, "--nproc 4"),
                 {fmt::format("split into 4 stages (num_stages: 4 in model.split_spec '{}')", spec),
                  "run 2 ranks (--nproc 2)", "(pipeline.data_parallel: 2)"});
  expect_trains(train(spec_config, "--nproc 2"), "--nproc 2");
  expect_trains(train(spec_config, "--nproc 4 --set pipeline.data_parallel=2"), "pipeline.data_parallel: 2");
  std::ofstream(spec) << "num_stages: 4\npolicy: parameters\n";
  expect_trains(train(spec_config, "--nproc 4"), "num_stages: 4 in the spec");

  // The inline config: the split fix is the config key itself.
  expect_refused(train(inline_config, "--nproc 4"), {"split into 4 stages (model.num_stages: 4)"});
  expect_trains(train(inline_config, "--nproc 4 --set model.num_stages=4"), "model.num_stages: 4");

  // An inline key by --set beside model.split_spec: named as the override.
  const CommandResult both = train(spec_config, "--nproc 4 --set model.num_stages=4");
  expect_refused(both, {"--set model.num_stages=4 sets an inline split key, but the config splits with "
                        "model.split_spec",
                        fmt::format("put the key in '{}' instead", spec)});
  EXPECT_FALSE(std::regex_search(both.output, std::regex(R"(\.yaml:[0-9])"))) << "no line of the file to point at:\n"
                                                                               << both.output;
}

TEST(TrainCliErrors, ExportNamesWhatIsWrong) {
  TrainWorkspace ws;
  auto r = runPipeforge(fmt::format("export '{}/nope' --model x.pt --out '{}/t.pt'", ws.dir(), ws.dir()));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("pipeforge export: error: checkpoint"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("does not exist"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace pipeforge::testing
