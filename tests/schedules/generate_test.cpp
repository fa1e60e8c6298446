#include "schedules/generate.h"

#include <chrono>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "schedules/lower.h"
#include "schedules/simulate_unit.h"
#include "schedules/validate.h"

namespace pipeforge::schedules {
namespace {

using ::testing::HasSubstr;

TEST(GenerateSchedule, NamesInCanonicalSpelling) {
  EXPECT_EQ(scheduleNames(),
            (std::vector<std::string>{"GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS",
                                      "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV",
                                      "MegatronInterleaved"}));
}

TEST(GenerateSchedule, LookupIgnoresCase) {
  ScheduleConfig config{2, 2, 4};
  Program reference = generateSchedule("Interleaved1F1B", config);
  EXPECT_EQ(generateSchedule("INTERLEAVED1F1B", config), reference);
  EXPECT_EQ(generateSchedule("interleaved1f1b", config), reference);
  EXPECT_EQ(generateSchedule("zbvzerobubble", config), generateSchedule("ZBVZeroBubble", config));
}

TEST(GenerateSchedule, UnknownNameListsTheValidOnes) {
  try {
    generateSchedule("ScheduleThatDoesNotExist", {2, 1, 4});
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("unknown schedule 'ScheduleThatDoesNotExist'"));
    EXPECT_THAT(e.what(), HasSubstr("GPipe, 1F1B, Interleaved1F1B, LoopedBFS, "
                                    "InterleavedZeroBubble, ZBVZeroBubble, DualPipeV, "
                                    "MegatronInterleaved"));
  }
}

TEST(GenerateSchedule, RejectsNonPositiveSizesAndAbsurdOnes) {
  for (ScheduleConfig config : {ScheduleConfig{0, 1, 4}, ScheduleConfig{2, 0, 4},
                                ScheduleConfig{2, 1, 0}, ScheduleConfig{-1, 1, 1}}) {
    try {
      generateSchedule("LoopedBFS", config);
      FAIL();
    } catch (const ScheduleError& e) {
      EXPECT_THAT(e.what(), HasSubstr("must each be at least 1"));
    }
  }
  try {
    generateSchedule("LoopedBFS", {1000, 1000, 1000});
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("more than the"));
  }
  ScheduleConfig negative_group{2, 2, 4};
  negative_group.microbatch_group_size_per_vp_stage = -1;
  EXPECT_THROW(generateSchedule("MegatronInterleaved", negative_group), ScheduleError);
}

TEST(GenerateSchedule, ProgramsCarryTheirShapeAndLayout) {
  Program loop = generateSchedule("Interleaved1F1B", {3, 2, 6});
  EXPECT_EQ(loop.num_ranks, 3);
  EXPECT_EQ(loop.num_stages, 6);
  EXPECT_EQ(loop.num_microbatches, 6);
  EXPECT_EQ(loop.stage_to_rank, makeStageToRank(3, 6, StageLayout::kLoop));
  Program v = generateSchedule("ZBVZeroBubble", {3, 2, 6});
  EXPECT_EQ(v.stage_to_rank, makeStageToRank(3, 6, StageLayout::kV));
}

// Every generator, every (stages per rank, microbatches, ranks) in
// {1..4} x {1..32} x {1..8}: either a ScheduleError saying why, or a program
// that validates and whose lowered form simulates without deadlock.
TEST(GenerateSchedule, SweepEveryGeneratorRejectsClearlyOrRuns) {
  auto start = std::chrono::steady_clock::now();
  int generated = 0;
  int rejected = 0;
  for (const std::string& name : scheduleNames()) {
    for (int spr = 1; spr <= 4; ++spr) {
      for (int m = 1; m <= 32; ++m) {
        for (int p = 1; p <= 8; ++p) {
          ScheduleConfig config{p, spr, m};
          Program program;
          try {
            program = generateSchedule(name, config);
          } catch (const ScheduleError& e) {
            ++rejected;
            std::string what = e.what();
            EXPECT_THAT(what, HasSubstr(name + " rejects num_ranks="));
            EXPECT_GT(what.size(), 80u) << what;  // a reason, not just the config
            continue;
          }
          ++generated;
          SCOPED_TRACE(name + " p=" + std::to_string(p) + " spr=" + std::to_string(spr) +
                       " m=" + std::to_string(m));
          try {
            validateProgram(program);
            Program lowered = lowerForExecution(program);
            for (const auto& rank : lowered.actions) {
              for (const auto& cell : rank) EXPECT_TRUE(cell.has_value());
            }
            UnitSimulation sim = simulateUnit(lowered);
            EXPECT_GT(sim.num_steps, 0);
          } catch (const ScheduleError& e) {
            ADD_FAILURE() << e.what();
          }
        }
      }
    }
  }
  // What PyTorch accepts: GPipe/1F1B one stage per rank (1F1B needs m >= p),
  // LoopedBFS everything, ZBV/DualPipeV two stages per rank.
  EXPECT_EQ(generated + rejected, 8 * 4 * 32 * 8);
  EXPECT_GT(generated, 3000);
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 30.0);
}

}  // namespace
}  // namespace pipeforge::schedules
