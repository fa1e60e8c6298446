// `pipeforge`: split PyTorch models into pipeline stages, inspect them,
// build pipeline schedules and train across ranks.
#include <CLI/CLI.hpp>
#include <torch/version.h>

#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/commands.h"
#include "common/fatal_signal.h"

int main(int argc, char** argv) {
  using namespace pipeforge::cli;
  pipeforge::installFatalSignalHandlers();  // Note [Fatal signals]: a crash says where
  CLI::App app{
      "Pipeforge: turn a PyTorch model, TorchScript (.pt, from torch.jit.script/trace) or torch.export "
      "(.pt2, from torch.export.save), into pipeline-parallel stages and train them.\n"
      "Typical flow: pipeforge split model.pt --spec split.yaml --out stages/; "
      "pipeforge inspect stages/; pipeforge train --config train.yaml --nproc 2; "
      "pipeforge eval --config train.yaml; pipeforge generate CKPT --model model.pt --prompt \"...\" --tokens 64; "
      "pipeforge plot out/metrics.jsonl --svg loss.svg",
      "pipeforge"};
  app.require_subcommand(1);
  // The LibTorch we were built with: stage files and checkpoints are only as
  // portable as that version (a file saved by a newer torch may not load).
#ifdef PIPEFORGE_HAVE_CUDA
  constexpr const char* kTorchFlavour = "CUDA";
#else
  constexpr const char* kTorchFlavour = "CPU";
#endif
  app.set_version_flag("--version", std::string("pipeforge 0.1.0 (LibTorch ") + TORCH_VERSION + ", " + kTorchFlavour + ")");
  app.footer("Run `pipeforge <command> --help` for the options of one command.");

  int exit_code = kExitOk;
  addSplitCommand(app, exit_code);
  addInspectCommand(app, exit_code);
  addScheduleCommand(app, exit_code);
  addTrainCommand(app, exit_code);
  addExportCommand(app, exit_code);
  addEvalCommand(app, exit_code);
  addGenerateCommand(app, exit_code);
  addPlotCommand(app, exit_code);

  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    std::string names;
    for (const auto* sub : app.get_subcommands([](CLI::App*) { return true; })) {
      known = known || sub->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      std::cerr << "pipeforge: error: unknown command '" << argv[1] << "'; commands: " << names << "\n"
                << "Run `pipeforge --help` for usage.\n";
      return kExitUsage;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Unknown subcommands and flags, missing values: always exit 2, as the help
    // promises, with the `pipeforge CMD: error:` prefix of every other error.
    CLI::App* command = nullptr;
    for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
      if (argc > 1 && sub->get_name() == argv[1]) command = sub;
    }
    std::string message = e.what();
    if (command != nullptr && dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
      // CLI11 lists the words it did not expect last first; say them as typed.
      const std::vector<std::string> extras = command->remaining();
      message = fmt::format("unexpected argument{} '{}'", extras.size() == 1 ? "" : "s", fmt::join(extras, " "));
    }
    const std::string name = command != nullptr ? "pipeforge " + command->get_name() : std::string("pipeforge");
    std::cerr << name << ": error: " << message << "\n"
              << "Run `" << name << " --help` for usage.\n";
    return kExitUsage;
  }
  return exit_code;
}
