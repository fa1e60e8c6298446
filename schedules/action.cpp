#include "schedules/action.h"

#include <array>
#include <cctype>
#include <climits>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "common/error.h"
#include "schedules/errors.h"

namespace pipeforge::schedules {
namespace {

struct TypeToken {
  ActionType type;
  std::string_view name;
};

// Every type with its PyTorch spelling (`_ComputationType` values).
constexpr std::array<TypeToken, 12> kTypeTokens{{
    {ActionType::kForward, "F"},
    {ActionType::kBackwardInput, "I"},
    {ActionType::kBackwardWeight, "W"},
    {ActionType::kFullBackward, "B"},
    {ActionType::kUnshard, "UNSHARD"},
    {ActionType::kReshard, "RESHARD"},
    {ActionType::kSendF, "SEND_F"},
    {ActionType::kRecvF, "RECV_F"},
    {ActionType::kSendB, "SEND_B"},
    {ActionType::kRecvB, "RECV_B"},
    {ActionType::kReduceGrad, "REDUCE_GRAD"},
    {ActionType::kOverlapFB, "OVERLAP_F_B"},
}};

constexpr std::string_view kExpectedForm =
    "expected <stage><TYPE>[<microbatch>] such as 1F0, 2I3, 0W1, 3B2, 1SEND_F2, 0RECV_B1, "
    "0UNSHARD, 0RESHARD, 0REDUCE_GRAD, or a composite (<F>;<B>)OVERLAP_F_B such as "
    "(0F7;7B3)OVERLAP_F_B";

// Quotes user text for an error message; control and non-ASCII bytes are
// escaped so a garbage input cannot garble the terminal, long text is cut.
std::string quote(std::string_view text) {
  std::string out = "\"";
  std::size_t shown = 0;
  for (char c : text) {
    if (++shown > 80) {
      out += "...";
      break;
    }
    auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (byte < 0x20 || byte >= 0x7f) {
      out += fmt::format("\\x{:02x}", byte);
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

[[noreturn]] void fail(std::string_view whole, std::string_view why) {
  throw ScheduleError(fmt::format("invalid action {}: {}; {}", quote(whole), why, kExpectedForm));
}

std::string_view trim(std::string_view text) {
  auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!text.empty() && space(text.front())) text.remove_prefix(1);
  while (!text.empty() && space(text.back())) text.remove_suffix(1);
  return text;
}

bool isDigit(char c) { return c >= '0' && c <= '9'; }
bool isTypeChar(char c) { return (c >= 'A' && c <= 'Z') || c == '_'; }

// Reads a non-negative decimal number at text[pos...]; advances pos.
std::optional<int> readNumber(std::string_view whole, std::string_view text, std::size_t& pos,
                              std::string_view what) {
  if (pos >= text.size() || !isDigit(text[pos])) return std::nullopt;
  long long value = 0;
  while (pos < text.size() && isDigit(text[pos])) {
    value = value * 10 + (text[pos] - '0');
    if (value > INT_MAX) fail(whole, fmt::format("the {} number is larger than {}", what, INT_MAX));
    ++pos;
  }
  return static_cast<int>(value);
}

Action parseSimple(std::string_view whole, std::string_view text) {
  std::size_t pos = 0;
  std::optional<int> stage = readNumber(whole, text, pos, "stage");
  if (!stage) fail(whole, "it must start with the stage number");
  std::size_t type_begin = pos;
  while (pos < text.size() && isTypeChar(text[pos])) ++pos;
  std::string_view token = text.substr(type_begin, pos - type_begin);
  if (token.empty()) {
    fail(whole, fmt::format("expected an action type (F, I, W, B, UNSHARD, RESHARD, SEND_F, "
                            "RECV_F, SEND_B, RECV_B, REDUCE_GRAD) after stage {}",
                            *stage));
  }
  std::optional<ActionType> type;
  for (const auto& entry : kTypeTokens) {
    if (entry.name == token) type = entry.type;
  }
  if (!type) fail(whole, fmt::format("unknown action type {}", quote(token)));
  if (*type == ActionType::kOverlapFB) {
    fail(whole, "OVERLAP_F_B is composite and needs its sub-actions in parentheses");
  }
  std::optional<int> microbatch = readNumber(whole, text, pos, "microbatch");
  if (pos != text.size()) {
    fail(whole, fmt::format("unexpected {} after {}", quote(text.substr(pos)),
                            quote(text.substr(0, pos))));
  }
  if (takesMicrobatch(*type) && !microbatch) {
    fail(whole, fmt::format("{} needs a microbatch number, e.g. {}{}0", token, *stage, token));
  }
  if (!takesMicrobatch(*type) && microbatch) {
    fail(whole, fmt::format("{} takes no microbatch number, write {}{}", token, *stage, token));
  }
  return Action{*stage, *type, microbatch, {}};
}

}  // namespace

std::string_view actionTypeName(ActionType type) {
  for (const auto& entry : kTypeTokens) {
    if (entry.type == type) return entry.name;
  }
  return "?";
}

void unknownActionType(ActionType type) {
  PIPEFORGE_FAIL(fmt::format("{} is not an ActionType", static_cast<int>(type)));
}

bool takesMicrobatch(ActionType type) {
  switch (type) {
    case ActionType::kUnshard:
    case ActionType::kReshard:
    case ActionType::kReduceGrad:
    case ActionType::kOverlapFB:
      return false;
    case ActionType::kForward:
    case ActionType::kBackwardInput:
    case ActionType::kBackwardWeight:
    case ActionType::kFullBackward:
    case ActionType::kSendF:
    case ActionType::kRecvF:
    case ActionType::kSendB:
    case ActionType::kRecvB:
      return true;
  }
  unknownActionType(type);
}

bool isCompute(ActionType type) {
  switch (type) {
    case ActionType::kForward:
    case ActionType::kBackwardInput:
    case ActionType::kBackwardWeight:
    case ActionType::kFullBackward:
    case ActionType::kOverlapFB:
      return true;
    case ActionType::kUnshard:
    case ActionType::kReshard:
    case ActionType::kSendF:
    case ActionType::kRecvF:
    case ActionType::kSendB:
    case ActionType::kRecvB:
    case ActionType::kReduceGrad:
      return false;
  }
  unknownActionType(type);
}

std::string formatAction(const Action& action) {
  if (action.type == ActionType::kOverlapFB) {
    std::string out = "(";
    for (std::size_t i = 0; i < action.sub_actions.size(); ++i) {
      if (i > 0) out += ';';
      out += formatAction(action.sub_actions[i]);
    }
    out += ')';
    out += actionTypeName(action.type);
    return out;
  }
  std::string out = std::to_string(action.stage);
  out += actionTypeName(action.type);
  if (action.microbatch) out += std::to_string(*action.microbatch);
  return out;
}

Action parseAction(std::string_view whole) {
  std::string_view text = trim(whole);
  if (text.empty()) fail(whole, "the text is empty");
  if (text.front() != '(') return parseSimple(whole, text);

  std::size_t close = text.find(')');
  if (close == std::string_view::npos) fail(whole, "the '(' of a composite action is never closed");
  if (text.substr(1, close - 1).find('(') != std::string_view::npos) {
    fail(whole, "composite actions cannot be nested");
  }
  std::string_view suffix = text.substr(close + 1);
  if (suffix != actionTypeName(ActionType::kOverlapFB)) {
    fail(whole, fmt::format("a composite action must end in )OVERLAP_F_B, found {} after ')'",
                            quote(suffix)));
  }
  Action composite{-1, ActionType::kOverlapFB, std::nullopt, {}};
  std::string_view inner = text.substr(1, close - 1);
  while (true) {
    std::size_t semi = inner.find(';');
    std::string_view part = trim(inner.substr(0, semi));
    if (part.empty()) fail(whole, "a composite action has an empty sub-action");
    Action sub = parseSimple(whole, part);
    if (!isCompute(sub.type)) {
      fail(whole, fmt::format("sub-action {} of a composite must be F, I, W or B",
                              formatAction(sub)));
    }
    composite.sub_actions.push_back(std::move(sub));
    if (semi == std::string_view::npos) break;
    inner.remove_prefix(semi + 1);
  }
  return composite;
}

}  // namespace pipeforge::schedules
