// `pipeforge generate CKPT --model M (--prompt TEXT | --prompt-tokens IDS) --tokens N [...]`.
#include <CLI/CLI.hpp>

#include <memory>
#include <optional>

#include "cli/commands.h"
#include "cli/launch_options.h"
#include "cli/run_guarded.h"
#include "tools/generate.h"

namespace pipeforge::cli {

void addGenerateCommand(CLI::App& app, int& exit_code) {
  auto request = std::make_shared<train::GenerateRequest>();
  auto prompt = std::make_shared<std::string>();
  auto prompt_tokens = std::make_shared<std::string>();
  auto block_size = std::make_shared<std::int64_t>(0);
  auto* sub = app.add_subcommand(
      "generate",
      "Sample tokens from a trained language model: the model is split into --nproc stages (parameters policy), "
      "each local rank loads its stages' weights from the checkpoint by name, and every new token is one pipelined "
      "forward of the context (cropped to the model's block size). Prints the prompt and the continuation: bytes as "
      "C-escaped text for --prompt, token ids for --prompt-tokens.");
  sub->add_option("checkpoint", request->checkpoint, "checkpoint folder (its `latest`) or one step_<N> folder")
      ->required();
  sub->add_option("--model", request->model_path,
                  "the model the run was trained from: TorchScript (.pt) or torch.export (.pt2)")
      ->required();
  auto* text = sub->add_option("--prompt", *prompt, "the prompt as bytes, one token per byte (a byte-level LM, "
                                                    "data.format: text)");
  auto* ids = sub->add_option("--prompt-tokens", *prompt_tokens, "the prompt as token ids, e.g. 1,2,3");
  text->excludes(ids);
  sub->add_option("--tokens", request->tokens, "how many tokens to sample")->required();
  sub->add_option("--temperature", request->temperature, "divide the logits by this; 0: greedy (argmax)")
      ->capture_default_str();
  sub->add_option("--top-k", request->top_k, "sample among the K most likely tokens; 0: all")->capture_default_str();
  sub->add_option("--seed", request->seed, "seed of the draws: the same seed gives the same tokens")
      ->capture_default_str();
  sub->add_option("--block-size", *block_size,
                  "the model's maximum sequence length (default: its position embedding's rows)");
  sub->add_option("--timeout", request->timeout_s, "seconds any rank waits for a peer")->capture_default_str();
  addLaunchOptions(sub, request->launch, request->split_dir,
                   LaunchHelp{"local ranks, one stage each (default: the checkpoint's stage count)", "the split to load"});
  sub->callback([=, &exit_code] {
    exit_code = runGuarded("generate", [&] {
      if (text->count() > 0) request->prompt = *prompt;
      if (ids->count() > 0) request->prompt_tokens = *prompt_tokens;
      if (sub->count("--block-size") > 0) request->block_size = *block_size;
      train::runGenerateRequest(*request);
      return kExitOk;
    });
  });
}

}  // namespace pipeforge::cli
