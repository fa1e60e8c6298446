// WriteTimeline answers which earlier stages changed some memory after a
// point in graph order, and which write was the last.
#include <gtest/gtest.h>

#include <set>

#include "stage/write_timeline.h"

namespace pipeforge {
namespace {

using stage::WriteTimeline;
using stage::Writer;

// Object 0 written at positions 2 (stage 0), 5 (stage 1) and 9 (stage 2); object 1 at 7 (stage 1).
WriteTimeline threeStages() {
  WriteTimeline t;
  t.add(0, {2, 0, nullptr, "aten::add_ at a.py:2"});
  t.add(0, {5, 1, nullptr, "aten::add_ at a.py:5"});
  t.add(1, {7, 1, nullptr, "aten::mul_ at a.py:7"});
  t.add(0, {9, 2, nullptr, "aten::add_ at a.py:9"});
  return t;
}

TEST(WriteTimeline, WritesAfterAPositionInStagesBeforeOne) {
  WriteTimeline t = threeStages();
  auto all = t.between({0}, -1, 3);
  EXPECT_EQ(all.stages, (std::set<int>{0, 1, 2}));
  ASSERT_NE(all.last, nullptr);
  EXPECT_EQ(all.last->op, "aten::add_ at a.py:9");

  auto before_stage_2 = t.between({0}, -1, 2);
  EXPECT_EQ(before_stage_2.stages, (std::set<int>{0, 1}));
  EXPECT_EQ(before_stage_2.last->position, 5);

  // A write at the position itself is not after it.
  auto after_2 = t.between({0}, 2, 3);
  EXPECT_EQ(after_2.stages, (std::set<int>{1, 2}));
}

TEST(WriteTimeline, LastWriteIsLatestInGraphOrderAcrossObjects) {
  WriteTimeline t = threeStages();
  auto both = t.between({0, 1}, 3, 2);
  EXPECT_EQ(both.stages, (std::set<int>{1}));
  ASSERT_NE(both.last, nullptr);
  EXPECT_EQ(both.last->position, 7);
  EXPECT_EQ(both.last->op, "aten::mul_ at a.py:7");
}

TEST(WriteTimeline, NothingWrittenGivesNoStagesAndNoLastWrite) {
  WriteTimeline t = threeStages();
  auto none = t.between({4}, -1, 3);
  EXPECT_TRUE(none.stages.empty());
  EXPECT_EQ(none.last, nullptr);
  auto too_late = t.between({0}, 9, 3);
  EXPECT_TRUE(too_late.stages.empty());
  EXPECT_EQ(too_late.last, nullptr);
}

TEST(WriteTimeline, IsWrittenAndByObject) {
  WriteTimeline t = threeStages();
  EXPECT_TRUE(t.isWritten(0));
  EXPECT_TRUE(t.isWritten(1));
  EXPECT_FALSE(t.isWritten(2));
  ASSERT_EQ(t.byObject().size(), 2u);
  const auto& writes = t.byObject().at(0);
  ASSERT_EQ(writes.size(), 3u);
  EXPECT_EQ(writes[0].position, 2);
  EXPECT_EQ(writes[1].position, 5);
  EXPECT_EQ(writes[2].position, 9);
}

}  // namespace
}  // namespace pipeforge
