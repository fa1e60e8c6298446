#include "schedules/csv.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/schedules/golden.h"

namespace pipeforge::schedules {
namespace {

using ::testing::HasSubstr;

using testing::readGolden;

TEST(Csv, EmptyCellsAreIdleSteps) {
  ActionGrid g = parseCsv("0F0,0F1,,0B0,   ,0B1\n,1F0,1B0,1F1,1B1,\n");
  ASSERT_EQ(g.size(), 2u);
  ASSERT_EQ(g[0].size(), 6u);
  EXPECT_EQ(formatAction(*g[0][1]), "0F1");
  EXPECT_FALSE(g[0][2].has_value());
  EXPECT_FALSE(g[0][4].has_value());  // "   " is idle, as _Action.from_str strips it
  ASSERT_EQ(g[1].size(), 6u);
  EXPECT_FALSE(g[1][0].has_value());
  EXPECT_FALSE(g[1][5].has_value());  // trailing comma: one more idle cell
  EXPECT_EQ(formatCsv(g), "0F0,0F1,,0B0,,0B1\n,1F0,1B0,1F1,1B1,\n");
}

TEST(Csv, AcceptsCrLfCrAndMissingFinalNewline) {
  ActionGrid expected = parseCsv("0F0,0B0\n1F0,1B0\n");
  EXPECT_EQ(parseCsv("0F0,0B0\r\n1F0,1B0\r\n"), expected);
  EXPECT_EQ(parseCsv("0F0,0B0\r1F0,1B0"), expected);
  EXPECT_EQ(parseCsv("0F0,0B0\n1F0,1B0"), expected);
}

TEST(Csv, QuotedCellsAndPythonsEmptyRecordRule) {
  ActionGrid g = parseCsv("\"0F0\",\"(0F1;3B0)OVERLAP_F_B\"\n\"\"\n\n");
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(formatAction(*g[0][1]), "(0F1;3B0)OVERLAP_F_B");
  ASSERT_EQ(g[1].size(), 1u);  // `""`: one idle cell
  EXPECT_FALSE(g[1][0].has_value());
  EXPECT_TRUE(g[2].empty());  // empty line: a rank with no actions
  EXPECT_EQ(formatCsv(g), "0F0,(0F1;3B0)OVERLAP_F_B\n\"\"\n\n");
}

TEST(Csv, EmptyTextHasNoRows) { EXPECT_TRUE(parseCsv("").empty()); }

TEST(Csv, ErrorsNameRowColumnAndForm) {
  try {
    parseCsv("0F0,0F1\n1F0,1Q0\n");
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("CSV row 2 (rank 1), column 2 (step 1)"));
    EXPECT_THAT(e.what(), HasSubstr("unknown action type \"Q\""));
  }
  try {
    parseCsv("0F0,\"0F1\n");
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("CSV line 1: a quoted cell is never closed"));
  }
  try {
    parseCsv("\"0F0\"x,0F1\n");
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("must be followed by ','"));
  }
}

TEST(Csv, GoldenFilesRoundTripByteForByte) {
  for (const char* name : {"dualpipev_4rank_10mb.csv", "zb1p_2rank_2stagep_compute.csv",
                           "zb1p_2rank_2stagep_comms.csv"}) {
    SCOPED_TRACE(name);
    std::string text = readGolden(name);
    EXPECT_EQ(formatCsv(parseCsv(text)), text);
    EXPECT_EQ(programToCsv(programFromCsv(text)), text);
  }
}

TEST(Csv, ProgramFromCsvInfersShapeAndStageToRank) {
  Program p = programFromCsv(readGolden("dualpipev_4rank_10mb.csv"));
  EXPECT_EQ(p.num_ranks, 4);
  EXPECT_EQ(p.num_stages, 8);
  EXPECT_EQ(p.num_microbatches, 10);
  EXPECT_EQ(p.stage_to_rank, (std::vector<int>{0, 1, 2, 3, 3, 2, 1, 0}));

  Program zb = programFromCsv(readGolden("zb1p_2rank_2stagep_compute.csv"));
  EXPECT_EQ(zb.num_ranks, 2);
  EXPECT_EQ(zb.num_stages, 4);
  EXPECT_EQ(zb.num_microbatches, 8);
  EXPECT_EQ(zb.stage_to_rank, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_FALSE(zb.actions[0][3].has_value());
  EXPECT_FALSE(zb.actions[1][0].has_value());
}

TEST(Csv, ProgramFromCsvRejectsInconsistentSchedules) {
  EXPECT_THROW(programFromCsv(""), ScheduleError);
  EXPECT_THROW(programFromCsv(",,\n,\n"), ScheduleError);
  try {
    programFromCsv("0F0,1F0\n1B0\n");
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("puts stage 1 on rank 0 (step 1) and on rank 1 (step 0)"));
  }
  try {
    programFromCsv("0F0,0B0\n2F0,2B0\n");
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("never mentions stage 1"));
  }
}

// Found by fuzz/schedule_csv (fuzz/regressions/schedule_csv/): numbers near
// INT_MAX made the stage and microbatch counts overflow.
TEST(Csv, HugeStageAndMicrobatchNumbersAreRefused) {
  auto message = [](const std::string& csv) {
    try {
      programFromCsv(csv);
    } catch (const ScheduleError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_THAT(message("2147483647F0\n"), HasSubstr("never mentions stage 0"));
  EXPECT_THAT(message("2000000000F0,2000000000B0\n"), HasSubstr("never mentions stage 0"));
  EXPECT_THAT(message("0F0,0F1,0I0,0W0,0I1,0F2147483647\n"),
              HasSubstr("names microbatch 2147483647, so it would have more microbatches than an int holds"));
}

TEST(Csv, FilesLoadAndDump) {
  Program p = programFromCsv("0F0,,0B0\n,1F0,1B0\n");
  std::string path = ::testing::TempDir() + "/pipeforge_csv_test.csv";
  dumpCsvFile(p, path);
  EXPECT_EQ(loadCsvFile(path), p);
  std::remove(path.c_str());
  try {
    loadCsvFile(path);
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot open schedule CSV"));
  }
  EXPECT_THROW(dumpCsvFile(p, "/nonexistent-dir/x.csv"), ScheduleError);
}

}  // namespace
}  // namespace pipeforge::schedules
