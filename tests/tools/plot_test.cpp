// `pipeforge plot`'s SVG: the polylines' points are the metrics mapped
// linearly onto each panel (SVG y grows downwards), the panels, ticks and
// legend are there, and bad logs are clear errors. Torch-free.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "tools/plot.h"

namespace pipeforge::train {
namespace {

struct XY {
  double x = 0, y = 0;
};

// The points of the polyline whose data-series is `name`.
std::vector<XY> polyline(const std::string& svg, const std::string& name) {
  const std::regex re("<polyline class=\"series\" data-series=\"" + name + "\"[^>]* points=\"([^\"]*)\"");
  std::smatch m;
  if (!std::regex_search(svg, m, re)) return {};
  std::vector<XY> out;
  std::istringstream in(m[1].str());
  std::string pair;
  while (in >> pair) {
    const auto comma = pair.find(',');
    out.push_back(XY{std::stod(pair.substr(0, comma)), std::stod(pair.substr(comma + 1))});
  }
  return out;
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

const char* kLog =
    R"({"event":"start","step":0,"world_size":2,"schedule":"1F1B","resumed_from":""}
{"event":"train","step":1,"loss":4.0,"lr":0.001,"tokens_per_s":1000.0,"step_s":0.5,"grad_norm":2.0}
{"event":"train","step":2,"loss":3.5,"lr":0.002,"tokens_per_s":1200.0,"step_s":0.4,"grad_norm":1.5}
{"event":"train","step":3,"loss":3.0,"lr":0.003,"tokens_per_s":1100.0,"step_s":0.4,"grad_norm":1.0}
{"event":"eval","step":3,"loss":3.25}
{"event":"checkpoint","step":3,"dir":"ckpt/step_00000003"}
{"event":"train","step":4,"loss":2.75,"lr":0.002,"tokens_per_s":1300.0,"step_s":0.4,"grad_norm":0.5}

{"event":"train","step":5,"loss":2.5,"lr":0.001,"tokens_per_s":1250.0,"step_s":0.4,"grad_norm":0.75}
{"event":"eval","step":5,"loss":2.9}
)";

// Each point's (x, y) is an affine map of (step, value): equal slopes
// between any two points, within the SVG's 0.01 rounding.
void expectAffine(const std::vector<XY>& points, const std::vector<double>& steps, const std::vector<double>& values,
                  double x_per_step, double y_per_value) {
  ASSERT_EQ(points.size(), steps.size());
  for (std::size_t i = 1; i < points.size(); ++i) {
    EXPECT_NEAR(points[i].x - points[0].x, (steps[i] - steps[0]) * x_per_step, 0.02) << "point " << i;
    EXPECT_NEAR(points[i].y - points[0].y, (values[i] - values[0]) * y_per_value, 0.02) << "point " << i;
  }
}

TEST(MetricsPlot, LossPointsMapLinearlyAndKeepTheirOrder) {
  const MetricsSeries m = parseMetricsLog(kLog, "run/metrics.jsonl");
  EXPECT_EQ(m.lines, 9);
  EXPECT_EQ(m.throughput_unit, "tokens/s");
  const std::string svg = metricsSvg(m);

  const std::vector<XY> train = polyline(svg, "train loss");
  ASSERT_EQ(train.size(), 5u);
  // Falling loss: each point lower on the page (a larger y), steps to the right.
  for (std::size_t i = 1; i < train.size(); ++i) {
    EXPECT_GT(train[i].x, train[i - 1].x);
    EXPECT_GT(train[i].y, train[i - 1].y);
  }
  const double x_per_step = (train[4].x - train[0].x) / 4.0;
  const double y_per_value = (train[4].y - train[0].y) / (2.5 - 4.0);
  EXPECT_GT(x_per_step, 0);
  EXPECT_LT(y_per_value, 0);
  expectAffine(train, {1, 2, 3, 4, 5}, {4.0, 3.5, 3.0, 2.75, 2.5}, x_per_step, y_per_value);

  // The held-out loss shares the panel's axes: its points follow the same map.
  const std::vector<XY> eval = polyline(svg, "held-out loss");
  ASSERT_EQ(eval.size(), 2u);
  EXPECT_NEAR(eval[0].x, train[2].x, 0.02);
  EXPECT_NEAR(eval[1].x, train[4].x, 0.02);
  EXPECT_NEAR(eval[0].y, train[0].y + (3.25 - 4.0) * y_per_value, 0.02);
  EXPECT_NEAR(eval[1].y, train[0].y + (2.9 - 4.0) * y_per_value, 0.02);

  // Every panel spans the same steps; each maps its own values.
  const std::vector<XY> lr = polyline(svg, "learning rate");
  ASSERT_EQ(lr.size(), 5u);
  EXPECT_NEAR(lr[0].x, train[0].x, 0.02);
  EXPECT_NEAR(lr[4].x, train[4].x, 0.02);
  EXPECT_LT(lr[2].y, lr[1].y);  // the peak lr is the highest point
  EXPECT_NEAR(lr[0].y, lr[4].y, 0.02);
  expectAffine(lr, {1, 2, 3, 4, 5}, {0.001, 0.002, 0.003, 0.002, 0.001}, x_per_step,
               (lr[2].y - lr[0].y) / (0.003 - 0.001));
  const std::vector<XY> speed = polyline(svg, "throughput");
  expectAffine(speed, {1, 2, 3, 4, 5}, {1000, 1200, 1100, 1300, 1250}, x_per_step,
               (speed[3].y - speed[0].y) / (1300.0 - 1000.0));
  const std::vector<XY> norm = polyline(svg, "grad norm");
  expectAffine(norm, {1, 2, 3, 4, 5}, {2.0, 1.5, 1.0, 0.5, 0.75}, x_per_step, (norm[3].y - norm[0].y) / (0.5 - 2.0));
}

TEST(MetricsPlot, PanelsTicksAndLegend) {
  PlotOptions options;
  options.title = "demo <run>";
  const std::string svg = metricsSvg(parseMetricsLog(kLog, "m.jsonl"), options);
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("</svg>\n"), std::string::npos);
  EXPECT_EQ(count(svg, "<text class=\"panel-title\""), 4);
  for (const char* title : {"Loss", "Learning rate", "Throughput (tokens/s)", "Gradient norm"}) {
    EXPECT_EQ(count(svg, std::string("\">") + title + "</text>"), 1) << title;
  }
  EXPECT_NE(svg.find(">demo &lt;run&gt;</text>"), std::string::npos);  // escaped
  EXPECT_EQ(count(svg, "class=\"x-label\""), 4);
  EXPECT_EQ(count(svg, "class=\"y-label\""), 4);
  // Steps 1..5: ticks at every step in each panel, labelled.
  EXPECT_EQ(count(svg, "class=\"x-tick\""), 4 * 5);
  for (const char* label : {">1</text>", ">3</text>", ">5</text>"}) EXPECT_GE(count(svg, label), 4) << label;
  // The loss axis (2.425 .. 4.075) is labelled at 2.5, 3, 3.5, 4.
  for (const char* label : {">2.5</text>", ">3</text>", ">3.5</text>", ">4</text>"}) EXPECT_GE(count(svg, label), 1);
  EXPECT_EQ(count(svg, "<g class=\"legend\">"), 5);
  EXPECT_NE(svg.find(">held-out loss</text>"), std::string::npos);
  EXPECT_EQ(count(svg, "class=\"no-data\""), 0);
  EXPECT_EQ(svg, metricsSvg(parseMetricsLog(kLog, "m.jsonl"), options));  // deterministic
}

TEST(MetricsPlot, PanelWithoutDataSaysSoAndRowsPerSecondIsThroughput) {
  const std::string log = R"({"event":"train","step":10,"loss":1.0,"lr":0.1,"rows_per_s":64.0}
{"event":"train","step":20,"loss":0.5,"lr":0.1,"rows_per_s":80.0}
)";
  const MetricsSeries m = parseMetricsLog(log, "m.jsonl");
  EXPECT_EQ(m.throughput_unit, "rows/s");
  ASSERT_EQ(m.throughput.size(), 2u);
  EXPECT_EQ(m.throughput[1].value, 80.0);
  const std::string svg = metricsSvg(m);
  EXPECT_NE(svg.find(">Throughput (rows/s)</text>"), std::string::npos);
  EXPECT_EQ(count(svg, "class=\"no-data\""), 1);
  EXPECT_NE(svg.find("no data: no &quot;train&quot; event has a &quot;grad_norm&quot;"), std::string::npos);
  EXPECT_TRUE(polyline(svg, "grad norm").empty());
  // A constant lr still gets a visible axis: both points at one height.
  const std::vector<XY> lr = polyline(svg, "learning rate");
  ASSERT_EQ(lr.size(), 2u);
  EXPECT_EQ(lr[0].y, lr[1].y);
  // No held-out loss: the loss panel draws the train loss alone.
  EXPECT_TRUE(polyline(svg, "held-out loss").empty());
  EXPECT_EQ(polyline(svg, "train loss").size(), 2u);
}

TEST(MetricsPlot, ResumedRunKeepsTheLastValueOfAStep) {
  // Steps 3 and 4 were logged, the run died, and it resumed from step 2.
  const std::string log = R"({"event":"train","step":1,"loss":5.0}
{"event":"train","step":2,"loss":4.0}
{"event":"train","step":3,"loss":3.0}
{"event":"train","step":4,"loss":2.0}
{"event":"start","step":2,"resumed_from":"ckpt/step_00000002"}
{"event":"train","step":3,"loss":3.5}
{"event":"train","step":4,"loss":2.5}
{"event":"train","step":5,"loss":null}
)";
  const MetricsSeries m = parseMetricsLog(log, "m.jsonl");
  ASSERT_EQ(m.train_loss.size(), 4u);  // a null (non-finite) loss is no point
  EXPECT_EQ(m.train_loss[2].step, 3);
  EXPECT_EQ(m.train_loss[2].value, 3.5);
  EXPECT_EQ(m.train_loss[3].value, 2.5);
  EXPECT_TRUE(m.lr.empty());
  EXPECT_EQ(m.throughput_unit, "");
}

void expectError(const std::string& text, const std::vector<std::string>& fragments) {
  try {
    parseMetricsLog(text, "out/metrics.jsonl");
    ADD_FAILURE() << "no error for:\n" << text;
  } catch (const PlotError& e) {
    for (const auto& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

TEST(MetricsPlot, BadLogsAreClearErrors) {
  expectError("{\"event\":\"train\",\"step\":1,\"loss\":2}\nstep 2 loss 1.5\n",
              {"out/metrics.jsonl:2: not JSON", "one JSON object per line"});
  expectError("[1, 2]\n", {"out/metrics.jsonl:1: [1,2] is not a JSON object"});
  expectError("", {"out/metrics.jsonl: no \"train\" events in 0 lines", "at least one step"});
  expectError("{\"event\":\"eval\",\"step\":5,\"loss\":2}\n", {"no \"train\" events in 1 line;"});
  expectError("{\"event\":\"train\",\"loss\":2}\n", {"out/metrics.jsonl:1: a \"train\" event without a numeric \"step\""});
  expectError("{\"event\":\"train\",\"step\":1,\"loss\":\"low\"}\n",
              {"out/metrics.jsonl:1: \"loss\" is \"low\", not a number"});
}

TEST(MetricsPlot, MissingFileNamesIt) {
  const std::string path = "/nonexistent-pipeforge/metrics.jsonl";
  try {
    readMetricsLog(path);
    ADD_FAILURE() << "no error";
  } catch (const PlotError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cannot open metrics log '" + path + "': No such file or directory"), std::string::npos)
        << what;
  }
  char name[] = "/tmp/pf-plot-XXXXXX";
  const int fd = ::mkstemp(name);
  ASSERT_GE(fd, 0);
  ::close(fd);
  std::ofstream(name) << kLog;
  EXPECT_EQ(readMetricsLog(name).train_loss.size(), 5u);
  std::remove(name);
}

}  // namespace
}  // namespace pipeforge::train
