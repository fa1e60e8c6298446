// `pipeforge plot METRICS.jsonl --svg OUT.svg [--title T]`.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <iostream>
#include <memory>

#include "checkpoint/checkpoint.h"
#include "cli/commands.h"
#include "cli/run_guarded.h"
#include "common/atomic_file.h"
#include "tools/plot.h"

namespace pipeforge::cli {

void addPlotCommand(CLI::App& app, int& exit_code) {
  auto metrics = std::make_shared<std::string>();
  auto svg = std::make_shared<std::string>();
  auto options = std::make_shared<train::PlotOptions>();
  auto* sub = app.add_subcommand(
      "plot",
      "Draw a training run's metrics.jsonl as an SVG: train and held-out loss, learning rate, throughput and "
      "gradient norm against the step (a panel without data says so).");
  sub->add_option("metrics", *metrics, "the metrics.jsonl `pipeforge train` wrote in output.dir")->required();
  sub->add_option("--svg", *svg, "output SVG file (written atomically)")->required();
  sub->add_option("--title", options->title, "a title above the panels (default: the metrics file)");
  sub->callback([=, &exit_code] {
    exit_code = runGuarded("plot", [&] {
      const train::MetricsSeries series = train::readMetricsLog(*metrics);
      if (options->title.empty()) options->title = *metrics;
      writeFileAtomically(*svg, train::metricsSvg(series, *options));
      std::cout << fmt::format("plotted {} train and {} held-out points of {} -> {}\n", series.train_loss.size(),
                               series.eval_loss.size(), *metrics, *svg);
      return kExitOk;
    });
  });
}

}  // namespace pipeforge::cli
