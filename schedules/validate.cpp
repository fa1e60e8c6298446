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

}  // namespace

void validateProgram(const Program& program) {
  auto failAt = [&](std::string_view rule, int rank, int step, const std::string& what) {
    throw ScheduleError(fmt::format(
        "invalid schedule, rule \"{}\" broken: Rank {}, step {}: {}\n\nFull pipeline schedule:\n{}",
        rule, rank, step, what, formatGrid(program, step)));
  };
  auto failCount = [&](std::string_view rule, const std::string& what) {
    throw ScheduleError(fmt::format("invalid schedule, rule \"{}\" broken: {}\n\nFull pipeline "
                                    "schedule:\n{}",
                                    rule, what, formatGrid(program)));
  };

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

  std::vector<StageSeen> seen(program.num_stages);
  std::vector<int> stage_rank(program.num_stages, -1);
  std::vector<int> stage_first_step(program.num_stages, -1);

  auto process = [&](const Action& a, int rank, int step) {
    const int s = a.stage;
    const std::string text = formatAction(a);
    if (a.type == ActionType::kOverlapFB) {
      failAt("OVERLAP_F_B holds F/I/W/B", rank, step, "OVERLAP_F_B nested in OVERLAP_F_B");
    }
    if (s < 0 || s >= program.num_stages) {
      failAt("stage in range", rank, step,
             fmt::format("{} names stage {}, expected a stage in 0..{}", text, s,
                         program.num_stages - 1));
    }
    const bool needs_mb = a.type != ActionType::kUnshard && a.type != ActionType::kReshard &&
                          a.type != ActionType::kReduceGrad;
    if (needs_mb != a.microbatch.has_value()) {
      failAt("microbatch present exactly where needed", rank, step,
             fmt::format("{} {} a microbatch index", text, a.microbatch ? "has" : "lacks"));
    }
    const int mb = a.microbatch.value_or(-1);
    if (needs_mb && (mb < 0 || mb >= program.num_microbatches)) {
      failAt("microbatch in range", rank, step,
             fmt::format("{} names microbatch {}, expected a microbatch in 0..{}", text, mb,
                         program.num_microbatches - 1));
    }
    StageSeen& st = seen[s];
    // B and I both start a microbatch's backward: after its F, and only once.
    auto checkBackwardStart = [&](const char* what) {
      if (st.f.count(mb) == 0) {
        failAt("F before I/B", rank, step,
               fmt::format("Running {} for stage {}, microbatch {} without first running Forward "
                           "(expected {}F{} at an earlier step); move {}F{} before {}",
                           what, s, mb, s, mb, s, mb, text));
      }
      if (st.b.count(mb) > 0 || st.i.count(mb) > 0) {
        failAt("one backward per microbatch", rank, step,
               fmt::format("Running {} for stage {}, microbatch {} after its backward already ran; "
                           "remove {}",
                           what, s, mb, text));
      }
    };
    switch (a.type) {
      case ActionType::kForward:
        if (!st.f.insert(mb).second) {
          failAt("each F once", rank, step,
                 fmt::format("Running Forward for stage {}, microbatch {} a second time; "
                             "remove the repeated {}",
                             s, mb, text));
        }
        break;
      case ActionType::kFullBackward:
        checkBackwardStart("Full Backward");
        st.b.insert(mb);
        break;
      case ActionType::kBackwardInput:
        checkBackwardStart("Backward Input");
        st.i.insert(mb);
        break;
      case ActionType::kBackwardWeight:
        if (st.i.count(mb) == 0) {
          failAt("W after I", rank, step,
                 fmt::format("Running Backward Weight for stage {}, microbatch {} without first "
                             "running Backward Input (expected {}I{} at an earlier step); move "
                             "{}I{} before {}",
                             s, mb, s, mb, s, mb, text));
        }
        if (!st.w.insert(mb).second) {
          failAt("each W once", rank, step,
                 fmt::format("Running Backward Weight for stage {}, microbatch {} a second "
                             "time; remove the repeated {}",
                             s, mb, text));
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
    if (stage_rank[s] == -1) {
      stage_rank[s] = rank;
      stage_first_step[s] = step;
    } else if (stage_rank[s] != rank) {
      failAt("each stage on one rank", rank, step,
             fmt::format("Stage {} is assigned to both rank {} and rank {} (first seen there at "
                         "step {}); run all of stage {}'s actions on one rank",
                         s, rank, stage_rank[s], stage_first_step[s], s));
    }
    if (program.stage_to_rank[s] != rank) {
      failAt("each stage on its stage_to_rank rank", rank, step,
             fmt::format("{} runs on rank {}, but stage_to_rank puts stage {} on rank {}; move "
                         "it to rank {} or fix stage_to_rank",
                         text, rank, s, program.stage_to_rank[s], program.stage_to_rank[s]));
    }
  };

  for (int rank = 0; rank < program.num_ranks; ++rank) {
    const auto& list = program.actions[rank];
    for (int step = 0; step < static_cast<int>(list.size()); ++step) {
      if (!list[step]) continue;
      const Action& a = *list[step];
      if (a.type == ActionType::kOverlapFB) {
        if (a.sub_actions.empty()) {
          failAt("OVERLAP_F_B holds F/I/W/B", rank, step, "OVERLAP_F_B without sub-actions");
        }
        for (const auto& sub : a.sub_actions) {
          if (!isCompute(sub.type)) {
            failAt("OVERLAP_F_B holds F/I/W/B", rank, step,
                   fmt::format("sub-action {} must be F, I, W or B", formatAction(sub)));
          }
          process(sub, rank, step);
        }
      } else {
        process(a, rank, step);
      }
    }
  }

  const int m = program.num_microbatches;
  for (int s = 0; s < program.num_stages; ++s) {
    const auto& st = seen[s];
    int f = static_cast<int>(st.f.size());
    int b = static_cast<int>(st.b.size());
    int i = static_cast<int>(st.i.size());
    int w = static_cast<int>(st.w.size());
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
}

}  // namespace pipeforge::schedules
