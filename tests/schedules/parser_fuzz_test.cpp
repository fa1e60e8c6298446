// Property test for the text parsers (actions, CSV): random bytes and random
// mutations of valid text never crash, and every rejected input is reported
// as a ScheduleError (never another exception type).
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "schedules/csv.h"
#include "schedules/generate.h"

namespace pipeforge::schedules {
namespace {

enum class Outcome { kParsed, kRejected };

template <typename F>
Outcome attempt(F&& parse, const std::string& input) {
  try {
    parse(input);
    return Outcome::kParsed;
  } catch (const ScheduleError& e) {
    EXPECT_GT(std::string(e.what()).size(), 10u) << "empty error for input of size " << input.size();
    return Outcome::kRejected;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "non-ScheduleError " << e.what() << " for input \"" << input << "\"";
    return Outcome::kRejected;
  }
}

const std::string kAlphabet = "0123456789FIWBUNSHARDECV_GOLP();,\"\r\n -x";

std::string mutate(std::string text, std::mt19937& rng) {
  std::uniform_int_distribution<int> op(0, 4);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<std::size_t> pick(0, kAlphabet.size() - 1);
  int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    std::size_t pos = text.empty() ? 0 : rng() % (text.size() + 1);
    switch (op(rng)) {
      case 0:  // insert a character likely to matter
        text.insert(pos, 1, kAlphabet[pick(rng)]);
        break;
      case 1:  // insert a random byte
        text.insert(pos, 1, static_cast<char>(byte(rng)));
        break;
      case 2:  // delete
        if (pos < text.size()) text.erase(pos, 1);
        break;
      case 3:  // replace
        if (pos < text.size()) text[pos] = kAlphabet[pick(rng)];
        break;
      default:  // duplicate a slice
        if (!text.empty()) {
          std::size_t from = rng() % text.size();
          text.insert(pos, text.substr(from, 1 + rng() % 8));
        }
        break;
    }
  }
  return text;
}

std::vector<std::string> validActions() {
  return {"1F0",         "2I1",          "0W3",       "0B3",       "1UNSHARD",
          "3RESHARD",    "2SEND_B2",     "1RECV_F1",  "0SEND_F12", "7RECV_B0",
          "0REDUCE_GRAD", "(0F7;7B3)OVERLAP_F_B", "(1F2;6I0)OVERLAP_F_B"};
}

TEST(ParserFuzz, RandomBytesNeverCrashAndFailAsScheduleError) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int i = 0; i < 3000; ++i) {
    std::string input(rng() % 40, '\0');
    for (auto& c : input) c = static_cast<char>(byte(rng));
    attempt([](const std::string& s) { return parseAction(s); }, input);
    attempt([](const std::string& s) { return parseCsv(s); }, input);
    attempt([](const std::string& s) { return programFromCsv(s); }, input);
  }
}

TEST(ParserFuzz, MutatedActionsParseToSomethingThatRoundTripsOrFail) {
  std::mt19937 rng(99);
  int parsed = 0;
  int rejected = 0;
  const auto valid = validActions();
  for (int i = 0; i < 20000; ++i) {
    std::string input = mutate(valid[rng() % valid.size()], rng);
    try {
      Action a = parseAction(input);
      ++parsed;
      // Whatever parses must print in canonical form and parse back equal.
      EXPECT_EQ(parseAction(formatAction(a)), a) << input;
    } catch (const ScheduleError&) {
      ++rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "non-ScheduleError " << e.what() << " for \"" << input << "\"";
    }
  }
  EXPECT_GT(parsed, 100);
  EXPECT_GT(rejected, 1000);
}

TEST(ParserFuzz, MutatedScheduleCsvNeverCrashes) {
  std::mt19937 rng(7);
  const std::vector<std::string> seeds{
      formatCsv(generateSchedule("DualPipeV", {2, 2, 4}).actions),
      formatCsv(generateSchedule("InterleavedZeroBubble", {2, 2, 4}).actions),
      "0F0,0F1,,0B0,,0B1\n,1F0,1B0,1F1,1B1,\n",
      "\"0F0\",\"\"\n\"\"\n\n"};
  int parsed = 0;
  for (int i = 0; i < 4000; ++i) {
    std::string input = mutate(seeds[rng() % seeds.size()], rng);
    if (attempt([](const std::string& s) { return parseCsv(s); }, input) == Outcome::kParsed) {
      ++parsed;
      // What parses dumps to CSV that parses back to the same grid.
      ActionGrid grid = parseCsv(input);
      EXPECT_EQ(parseCsv(formatCsv(grid)), grid) << input;
    }
    attempt([](const std::string& s) { return programFromCsv(s); }, input);
  }
  EXPECT_GT(parsed, 100);
}

}  // namespace
}  // namespace pipeforge::schedules
