#include "schedules/svg_timeline.h"

#include <map>
#include <regex>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "schedules/csv.h"
#include "schedules/generate.h"

namespace pipeforge::schedules {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Box {
  std::string type;
  double x, y, width;
  std::string title;
};

// The op rectangles, with their geometry and tooltip.
std::vector<Box> opBoxes(const std::string& svg) {
  static const std::regex re(
      R"re(<rect class="op op-(\w+)" x="([0-9.]+)" y="([0-9.]+)" width="([0-9.]+)"[^>]*><title>([^<]*)</title></rect>)re");
  std::vector<Box> boxes;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator();
       ++it) {
    boxes.push_back({(*it)[1], std::stod((*it)[2]), std::stod((*it)[3]), std::stod((*it)[4]),
                     (*it)[5]});
  }
  return boxes;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(SvgTimeline, OneBoxPerComputeActionAtItsTime) {
  Program p = generateSchedule("InterleavedZeroBubble", {2, 2, 4});
  CostSimulation sim = simulateCost(p, CostModel::uniform(1, 1.5, 0.5, 0.25));
  SvgTimelineOptions options;
  options.pixels_per_unit = 10.0;
  const std::string svg = svgTimeline(sim, p.num_ranks, p.stage_to_rank, options);
  const SvgTimelineLayout layout = svgTimelineLayout(sim, options);
  const std::vector<Box> boxes = opBoxes(svg);
  ASSERT_EQ(boxes.size(), sim.events.size());  // all compute here
  EXPECT_EQ(count(svg, "<rect class=\"op "), sim.events.size());
  std::map<std::string, const TimedAction*> by_name;
  for (const TimedAction& e : sim.events) by_name[formatAction(e.action)] = &e;
  for (const Box& b : boxes) {
    // The tooltip reads "rank R: ACTION START-END".
    const std::string name = b.title.substr(b.title.find(": ") + 2, b.title.find(' ', b.title.find(": ") + 2) - b.title.find(": ") - 2);
    ASSERT_TRUE(by_name.count(name)) << b.title;
    const TimedAction& e = *by_name[name];
    EXPECT_NEAR(b.x, layout.x(e.start), 0.006) << name;
    EXPECT_NEAR(b.width, (e.end - e.start) * 10.0, 0.006) << name;
    EXPECT_NEAR(b.y, layout.y(e.rank), 0.006) << name;
    EXPECT_EQ(b.type, std::string(actionTypeName(e.action.type)));
  }
}

TEST(SvgTimeline, MicrobatchNumbersIdleGapsAndLegend) {
  Program p = programFromCsv("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n");
  CostSimulation sim = simulateCost(p, CostModel::uniform(1, 1, 1));
  const std::string svg = svgTimeline(sim, 2);
  EXPECT_EQ(count(svg, "<text class=\"mb\""), 8u);
  EXPECT_THAT(svg, HasSubstr(">0</text>"));
  EXPECT_THAT(svg, HasSubstr(">1</text>"));
  // Rank 1 waits one unit before its first F, and rank 0 two before its first B.
  EXPECT_THAT(svg, HasSubstr("<title>rank 1 idle 0.00-1.00</title>"));
  EXPECT_THAT(svg, HasSubstr("<title>rank 0 idle 2.00-4.00</title>"));
  for (const char* entry : {"F forward", "I backward (input)", "W backward (weight)",
                            "B backward (full)", "OVERLAP_F_B", ">idle<"}) {
    EXPECT_THAT(svg, HasSubstr(entry));
  }
  // Distinct colours per type.
  EXPECT_THAT(svg, HasSubstr("class=\"op op-F\""));
  EXPECT_THAT(svg, HasSubstr("class=\"op op-B\""));
  EXPECT_EQ(svg.rfind("</svg>\n"), svg.size() - 7);
}

TEST(SvgTimeline, LaterStagesOfARankAreLighter) {
  // V layout on 2 ranks: rank 0 holds stages 0 and 3, rank 1 stages 1 and 2.
  Program p = generateSchedule("ZBVZeroBubble", {2, 2, 2});
  const std::string svg =
      svgTimeline(simulateCost(p, CostModel::uniform(1, 1, 1)), 2, p.stage_to_rank);
  auto fillOf = [&](const std::string& tooltip_start) {
    const std::regex re("fill=\"(#[0-9a-f]{6})\" [^>]*><title>" + tooltip_start);
    std::smatch m;
    return std::regex_search(svg, m, re) ? m[1].str() : std::string("(none)");
  };
  EXPECT_EQ(fillOf("rank 0: 0F0 "), "#76a5d8");  // F's colour
  EXPECT_EQ(fillOf("rank 0: 3F0 "), "#bbd2ec");  // half white: the rank's second stage
  EXPECT_EQ(fillOf("rank 1: 1F0 "), "#76a5d8");
  EXPECT_EQ(fillOf("rank 1: 2F0 "), "#bbd2ec");
  EXPECT_THAT(svg, HasSubstr("lighter = later stage on the rank; numbers = microbatch"));

  // Without a layout nothing is shaded and the legend says only what the numbers are.
  const std::string plain = svgTimeline(simulateCost(p, CostModel::uniform(1, 1, 1)), 2);
  EXPECT_THAT(plain, Not(HasSubstr("#bbd2ec")));
  EXPECT_THAT(plain, Not(HasSubstr("lighter")));
  EXPECT_THAT(plain, HasSubstr(">numbers = microbatch</text>"));
}

TEST(SvgTimeline, OverlapBoxNamesTheMicrobatchOfEachHalf) {
  Action overlap{0, ActionType::kOverlapFB, std::nullopt,
                 {Action{0, ActionType::kForward, 3, {}}, Action{0, ActionType::kFullBackward, 1, {}}}};
  CostSimulation sim;
  sim.makespan = 2.0;
  sim.events.push_back(TimedAction{0, 0, overlap, 0.0, 2.0, std::nullopt});
  const std::string svg = svgTimeline(sim, 1);
  EXPECT_EQ(count(svg, "<text class=\"mb\""), 1u);
  EXPECT_THAT(svg, HasSubstr(">3/1</text>"));
  EXPECT_THAT(svg, HasSubstr("class=\"op op-OVERLAP_F_B\""));
}

TEST(SvgTimeline, ByteIdenticalForEqualInput) {
  Program p = generateSchedule("ZBVZeroBubble", {4, 2, 8});
  CostModel c = CostModel::uniform(1, 1.3, 0.7, 0.1);
  SvgTimelineOptions o;
  o.title = "ZBV <4 ranks> & 8 microbatches";
  const std::string a = svgTimeline(simulateCost(p, c), 4, p.stage_to_rank, o);
  const std::string b = svgTimeline(simulateCost(p, c), 4, p.stage_to_rank, o);
  EXPECT_EQ(a, b);
  EXPECT_THAT(a, HasSubstr("ZBV &lt;4 ranks&gt; &amp; 8 microbatches"));
  EXPECT_THAT(a, HasSubstr("lighter = later stage"));
}

TEST(SvgTimeline, SkipsZeroTimeActionsAndChecksInput) {
  Program p = programFromCsv(
      "0F0,0SEND_F0,0RECV_B0,0B0\n"
      "1RECV_F0,1F0,1B0,1SEND_B0\n");
  CostSimulation sim = simulateCost(p, CostModel::uniform(1, 1, 1));
  EXPECT_EQ(opBoxes(svgTimeline(sim, 2)).size(), 4u);
  EXPECT_THROW(svgTimeline(sim, 1), ScheduleError);
  SvgTimelineOptions bad;
  bad.lane_height = 0.0;
  EXPECT_THROW(svgTimeline(sim, 2, {}, bad), ScheduleError);
}

}  // namespace
}  // namespace pipeforge::schedules
