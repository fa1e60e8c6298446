// validateProgram: PyTorch's `_validate_schedule` rules, in PyTorch's order
// (ranks in turn, each rank's steps in order, then the per-stage counts),
// plus checks PyTorch leaves to chance (stage/microbatch ranges, repeated
// actions, agreement with stage_to_rank). The first broken rule is reported.
#include "schedules/validate.h"

#include <set>

#include <fmt/format.h>

#include "schedules/format_grid.h"

namespace pipeforge::schedules {
namespace {

struct StageSeen {
  std::set<int> f, b, i, w;
};

// The rules that make the rest checkable: one list per rank, at least one
// stage and microbatch, one stage_to_rank entry per stage.
void checkShape(const Program& program) {
  if (static_cast<int>(program.actions.size()) != program.num_ranks) {
    throw ScheduleError(fmt::format(
        "invalid schedule, rule \"one action list per rank\" broken: Schedule has incorrect "
        "number of ranks - expected {}, actual {}; give one list (CSV row) per rank",
        program.num_ranks, program.actions.size()));
  }
  if (program.num_stages < 1 || program.num_microbatches < 1) {
    throw ScheduleError(fmt::format(
        "invalid schedule: it needs at least 1 stage and 1 microbatch, has {} and {}",
        program.num_stages, program.num_microbatches));
  }
  if (static_cast<int>(program.stage_to_rank.size()) != program.num_stages) {
    throw ScheduleError(fmt::format(
        "invalid schedule: stage_to_rank has {} entries for {} stages; give one rank per stage",
        program.stage_to_rank.size(), program.num_stages));
  }
}

// Walks the steps in PyTorch's order, remembering per stage which microbatches
// ran F, B, I and W and where the stage was first seen; then checks the counts.
class Validator {
 public:
  explicit Validator(const Program& program)
      : program_(program),
        seen_(program.num_stages),
        stage_rank_(program.num_stages, -1),
        stage_first_step_(program.num_stages, -1) {}

  void checkSteps();
  void checkCounts() const;

 private:
  [[noreturn]] void failAt(std::string_view rule, int rank, int step, const std::string& what) const;
  [[noreturn]] void failCount(std::string_view rule, const std::string& what) const;
  void checkStep(const Action& a, int rank, int step);
  void checkAction(const Action& a, int rank, int step);
  int checkRanges(const Action& a, int rank, int step) const;
  void recordCompute(const Action& a, int mb, int rank, int step);
  void checkBackwardStart(const Action& a, const char* what, int mb, int rank, int step) const;
  void checkPlacement(const Action& a, int rank, int step);
  void checkStageCounts(int s) const;

  const Program& program_;
  std::vector<StageSeen> seen_;
  std::vector<int> stage_rank_;
  std::vector<int> stage_first_step_;
};

void Validator::failAt(std::string_view rule, int rank, int step, const std::string& what) const {
  throw ScheduleError(fmt::format(
      "invalid schedule, rule \"{}\" broken: Rank {}, step {}: {}\n\nFull pipeline schedule:\n{}",
      rule, rank, step, what, formatGrid(program_, step)));
}

void Validator::failCount(std::string_view rule, const std::string& what) const {
  throw ScheduleError(fmt::format("invalid schedule, rule \"{}\" broken: {}\n\nFull pipeline "
                                  "schedule:\n{}",
                                  rule, what, formatGrid(program_)));
}

void Validator::checkSteps() {
  for (int rank = 0; rank < program_.num_ranks; ++rank) {
    const auto& list = program_.actions[rank];
    for (int step = 0; step < static_cast<int>(list.size()); ++step) {
      if (list[step]) checkStep(*list[step], rank, step);
    }
  }
}

// An OVERLAP_F_B counts as its sub-actions, in order, at its step.
void Validator::checkStep(const Action& a, int rank, int step) {
  if (a.type != ActionType::kOverlapFB) {
    checkAction(a, rank, step);
    return;
  }
  if (a.sub_actions.empty()) {
    failAt("OVERLAP_F_B holds F/I/W/B", rank, step, "OVERLAP_F_B without sub-actions");
  }
  for (const auto& sub : a.sub_actions) {
    if (!isCompute(sub.type)) {
      failAt("OVERLAP_F_B holds F/I/W/B", rank, step,
             fmt::format("sub-action {} must be F, I, W or B", formatAction(sub)));
    }
    checkAction(sub, rank, step);
  }
}

void Validator::checkAction(const Action& a, int rank, int step) {
  if (a.type == ActionType::kOverlapFB) {
    failAt("OVERLAP_F_B holds F/I/W/B", rank, step, "OVERLAP_F_B nested in OVERLAP_F_B");
  }
  const int mb = checkRanges(a, rank, step);
  recordCompute(a, mb, rank, step);
  checkPlacement(a, rank, step);
}

// The stage in range, a microbatch exactly where the type needs one and in
// range; returns it (-1 for UNSHARD, RESHARD and REDUCE_GRAD).
int Validator::checkRanges(const Action& a, int rank, int step) const {
  const int s = a.stage;
  const std::string text = formatAction(a);
  if (s < 0 || s >= program_.num_stages) {
    failAt("stage in range", rank, step,
           fmt::format("{} names stage {}, expected a stage in 0..{}", text, s,
                       program_.num_stages - 1));
  }
  const bool needs_mb = a.type != ActionType::kUnshard && a.type != ActionType::kReshard &&
                        a.type != ActionType::kReduceGrad;
  if (needs_mb != a.microbatch.has_value()) {
    failAt("microbatch present exactly where needed", rank, step,
           fmt::format("{} {} a microbatch index", text, a.microbatch ? "has" : "lacks"));
  }
  const int mb = a.microbatch.value_or(-1);
  if (needs_mb && (mb < 0 || mb >= program_.num_microbatches)) {
    failAt("microbatch in range", rank, step,
           fmt::format("{} names microbatch {}, expected a microbatch in 0..{}", text, mb,
                       program_.num_microbatches - 1));
  }
  return mb;
}

// F, B, I and W in their order per stage and microbatch, each once.
void Validator::recordCompute(const Action& a, int mb, int rank, int step) {
  const int s = a.stage;
  StageSeen& st = seen_[s];
  switch (a.type) {
    case ActionType::kForward:
      if (!st.f.insert(mb).second) {
        failAt("each F once", rank, step,
               fmt::format("Running Forward for stage {}, microbatch {} a second time; "
                           "remove the repeated {}",
                           s, mb, formatAction(a)));
      }
      break;
    case ActionType::kFullBackward:
      checkBackwardStart(a, "Full Backward", mb, rank, step);
      st.b.insert(mb);
      break;
    case ActionType::kBackwardInput:
      checkBackwardStart(a, "Backward Input", mb, rank, step);
      st.i.insert(mb);
      break;
    case ActionType::kBackwardWeight:
      if (st.i.count(mb) == 0) {
        failAt("W after I", rank, step,
               fmt::format("Running Backward Weight for stage {}, microbatch {} without first "
                           "running Backward Input (expected {}I{} at an earlier step); move "
                           "{}I{} before {}",
                           s, mb, s, mb, s, mb, formatAction(a)));
      }
      if (!st.w.insert(mb).second) {
        failAt("each W once", rank, step,
               fmt::format("Running Backward Weight for stage {}, microbatch {} a second "
                           "time; remove the repeated {}",
                           s, mb, formatAction(a)));
      }
      break;
    case ActionType::kUnshard:
    case ActionType::kReshard:
    case ActionType::kSendF:
    case ActionType::kRecvF:
    case ActionType::kSendB:
    case ActionType::kRecvB:
    case ActionType::kReduceGrad:
    case ActionType::kOverlapFB:
      break;
  }
}

// B and I both start a microbatch's backward: after its F, and only once.
void Validator::checkBackwardStart(const Action& a, const char* what, int mb, int rank,
                                   int step) const {
  const int s = a.stage;
  const StageSeen& st = seen_[s];
  if (st.f.count(mb) == 0) {
    failAt("F before I/B", rank, step,
           fmt::format("Running {} for stage {}, microbatch {} without first running Forward "
                       "(expected {}F{} at an earlier step); move {}F{} before {}",
                       what, s, mb, s, mb, s, mb, formatAction(a)));
  }
  if (st.b.count(mb) > 0 || st.i.count(mb) > 0) {
    failAt("one backward per microbatch", rank, step,
           fmt::format("Running {} for stage {}, microbatch {} after its backward already ran; "
                       "remove {}",
                       what, s, mb, formatAction(a)));
  }
}

// Every action of a stage on one rank, the one stage_to_rank names.
void Validator::checkPlacement(const Action& a, int rank, int step) {
  const int s = a.stage;
  if (stage_rank_[s] == -1) {
    stage_rank_[s] = rank;
    stage_first_step_[s] = step;
  } else if (stage_rank_[s] != rank) {
    failAt("each stage on one rank", rank, step,
           fmt::format("Stage {} is assigned to both rank {} and rank {} (first seen there at "
                       "step {}); run all of stage {}'s actions on one rank",
                       s, rank, stage_rank_[s], stage_first_step_[s], s));
  }
  if (program_.stage_to_rank[s] != rank) {
    failAt("each stage on its stage_to_rank rank", rank, step,
           fmt::format("{} runs on rank {}, but stage_to_rank puts stage {} on rank {}; move "
                       "it to rank {} or fix stage_to_rank",
                       formatAction(a), rank, s, program_.stage_to_rank[s],
                       program_.stage_to_rank[s]));
  }
}

void Validator::checkCounts() const {
  for (int s = 0; s < program_.num_stages; ++s) checkStageCounts(s);
}

void Validator::checkStageCounts(int s) const {
  const int m = program_.num_microbatches;
  const StageSeen& st = seen_[s];
  const int f = static_cast<int>(st.f.size());
  const int b = static_cast<int>(st.b.size());
  const int i = static_cast<int>(st.i.size());
  const int w = static_cast<int>(st.w.size());
  if (f != m) {
    failCount("F count = microbatches",
              fmt::format("Got {} F microbatches for stage {}, expected {}; every stage runs F "
                          "once for each of microbatches 0..{}",
                          f, s, m, m - 1));
  }
  if (i != w) {
    failCount("I count = W count",
              fmt::format("Invalid backward microbatches for stage {}: I and W must have equal "
                          "counts, but got I={}, W={}; give every I its W (or merge them into B)",
                          s, i, w));
  }
  if (b + (i + w) / 2 != m) {
    failCount("B + (I+W)/2 = microbatches",
              fmt::format("Invalid backward microbatches for stage {}: expected {} total "
                          "backwards, but got B={}, I={}, W={}; every microbatch needs one B "
                          "or one I+W pair",
                          s, m, b, i, w));
  }
}

}  // namespace

void validateProgram(const Program& program) {
  checkShape(program);
  Validator validator(program);
  validator.checkSteps();
  validator.checkCounts();
}

}  // namespace pipeforge::schedules
