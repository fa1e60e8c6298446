#include "schedules/action.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "schedules/program.h"

namespace pipeforge::schedules {
namespace {

using ::testing::HasSubstr;

Action simple(int stage, ActionType type, std::optional<int> mb) { return Action{stage, type, mb, {}}; }

// PyTorch's test_action_parse cases plus the types it leaves out.
TEST(ParseAction, PyTorchExamplesRoundTrip) {
  struct Case {
    std::string text;
    Action expected;
  };
  const std::vector<Case> cases{
      {"1F0", simple(1, ActionType::kForward, 0)},
      {"2I1", simple(2, ActionType::kBackwardInput, 1)},
      {"0W3", simple(0, ActionType::kBackwardWeight, 3)},
      {"0B3", simple(0, ActionType::kFullBackward, 3)},
      {"1UNSHARD", simple(1, ActionType::kUnshard, std::nullopt)},
      {"3RESHARD", simple(3, ActionType::kReshard, std::nullopt)},
      {"2SEND_B2", simple(2, ActionType::kSendB, 2)},
      {"1RECV_F1", simple(1, ActionType::kRecvF, 1)},
      {"0SEND_F12", simple(0, ActionType::kSendF, 12)},
      {"15RECV_B7", simple(15, ActionType::kRecvB, 7)},
      {"0REDUCE_GRAD", simple(0, ActionType::kReduceGrad, std::nullopt)},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    Action parsed = parseAction(c.text);
    EXPECT_EQ(parsed, c.expected);
    EXPECT_EQ(formatAction(parsed), c.text);
  }
}

TEST(ParseAction, CompositeOverlapHasStageMinusOneAndTwoSubActions) {
  Action a = parseAction("(0F7;7B3)OVERLAP_F_B");
  EXPECT_EQ(a.type, ActionType::kOverlapFB);
  EXPECT_EQ(a.stage, -1);
  EXPECT_FALSE(a.microbatch.has_value());
  ASSERT_EQ(a.sub_actions.size(), 2u);
  EXPECT_EQ(a.sub_actions[0], simple(0, ActionType::kForward, 7));
  EXPECT_EQ(a.sub_actions[1], simple(7, ActionType::kFullBackward, 3));
  EXPECT_EQ(formatAction(a), "(0F7;7B3)OVERLAP_F_B");
}

TEST(ParseAction, TrimsSurroundingWhitespaceLikePyTorch) {
  EXPECT_EQ(parseAction("  2F5\t"), simple(2, ActionType::kForward, 5));
  EXPECT_EQ(formatAction(parseAction(" ( 0F1 ; 1B0 )OVERLAP_F_B ")), "(0F1;1B0)OVERLAP_F_B");
}

TEST(ParseAction, LeadingZerosReadAsNumbers) {
  EXPECT_EQ(parseAction("01F007"), simple(1, ActionType::kForward, 7));
}

TEST(ParseAction, MalformedTextNamesTheProblemAndTheExpectedForm) {
  struct Case {
    std::string text;
    std::string why;
  };
  const std::vector<Case> cases{
      {"", "the text is empty"},
      {"   ", "the text is empty"},
      {"F0", "must start with the stage number"},
      {"1", "expected an action type"},
      {"1X0", "unknown action type \"X\""},
      {"1f0", "expected an action type"},
      {"1F", "F needs a microbatch number, e.g. 1F0"},
      {"2SEND_B", "SEND_B needs a microbatch number"},
      {"0UNSHARD1", "UNSHARD takes no microbatch number, write 0UNSHARD"},
      {"0REDUCE_GRAD3", "REDUCE_GRAD takes no microbatch number"},
      {"1F0x", "unexpected \"x\" after \"1F0\""},
      {"1F0 1F1", "unexpected"},
      {"1F-1", "unexpected \"-1\""},
      {"99999999999F0", "larger than"},
      {"1F99999999999", "larger than"},
      {"0OVERLAP_F_B", "needs its sub-actions in parentheses"},
      {"(0F1;1B0", "never closed"},
      {"(0F1;1B0)", "must end in )OVERLAP_F_B"},
      {"(0F1;1B0)SEND_F", "must end in )OVERLAP_F_B"},
      {"()OVERLAP_F_B", "empty sub-action"},
      {"(0F1;)OVERLAP_F_B", "empty sub-action"},
      {"(0SEND_F1;1B0)OVERLAP_F_B", "must be F, I, W or B"},
      {"((0F1;1B0)OVERLAP_F_B)OVERLAP_F_B", "cannot be nested"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    try {
      parseAction(c.text);
      ADD_FAILURE() << "parsed";
    } catch (const ScheduleError& e) {
      EXPECT_THAT(e.what(), HasSubstr(c.why));
      EXPECT_THAT(e.what(), HasSubstr("expected <stage><TYPE>[<microbatch>]"));
    }
  }
}

TEST(ParseAction, ErrorMessagesEscapeControlBytes) {
  try {
    parseAction(std::string("1F\x01\xff", 4));
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_THAT(e.what(), HasSubstr("\\x01\\xff"));
  }
}

TEST(ActionType, NamesAndComputeClassification) {
  EXPECT_EQ(actionTypeName(ActionType::kSendF), "SEND_F");
  EXPECT_EQ(actionTypeName(ActionType::kOverlapFB), "OVERLAP_F_B");
  EXPECT_EQ(actionTypeName(ActionType::kReduceGrad), "REDUCE_GRAD");
  for (auto t : {ActionType::kForward, ActionType::kBackwardInput, ActionType::kBackwardWeight,
                 ActionType::kFullBackward, ActionType::kOverlapFB}) {
    EXPECT_TRUE(isCompute(t)) << actionTypeName(t);
  }
  for (auto t : {ActionType::kUnshard, ActionType::kReshard, ActionType::kSendF,
                 ActionType::kRecvF, ActionType::kSendB, ActionType::kRecvB,
                 ActionType::kReduceGrad}) {
    EXPECT_FALSE(isCompute(t)) << actionTypeName(t);
  }
}

TEST(ActionKey, DistinguishesStageTypeAndMicrobatch) {
  ActionKeyHash hash;
  ActionKey a = keyOf(parseAction("1F0"));
  EXPECT_EQ(a, (ActionKey{1, ActionType::kForward, 0}));
  EXPECT_FALSE(a == keyOf(parseAction("1F1")));
  EXPECT_FALSE(a == keyOf(parseAction("0F0")));
  EXPECT_FALSE(a == keyOf(parseAction("1B0")));
  EXPECT_EQ(keyOf(parseAction("2UNSHARD")).microbatch, -1);
  EXPECT_EQ(hash(a), hash(keyOf(parseAction("1F0"))));
}

}  // namespace
}  // namespace pipeforge::schedules
