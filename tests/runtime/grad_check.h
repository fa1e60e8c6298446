// The acceptance check shared by the in-process and the multi-process tests:
// run one training step of a zoo model through a schedule and compare the
// losses and every gradient this rank holds with single-process autograd on
// the unsplit model.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/comm.h"

namespace pipeforge::testing {

struct GradCase {
  std::string model;     // "mlp", "gpt", "multi_io"
  std::string schedule;  // a schedules::scheduleNames() entry
  int ranks = 2;
  int stages_per_rank = 1;
  int microbatches = 4;
};

struct CaseReport {
  bool ok = true;
  std::string message;  // what differed, or a summary
  int params_checked = 0;
  double max_grad_err = 0.0;
  double loss_err = 0.0;
};

inline constexpr double kRtol = 1e-5;
inline constexpr double kAtol = 4e-5;

// Stages per rank a schedule runs with in these tests (2 for multi-stage ones).
int stagesPerRankFor(const std::string& schedule);

// Every acceptance case for `ranks` ranks: zoo models x every named schedule
// (schedules::scheduleNames()).
std::vector<GradCase> acceptanceCases(int ranks);

// Runs `c` on this rank over `comm`. The split folder is
// <splits_root>/<model>_<stages>. Never throws for a mismatch: it reports it.
CaseReport runGradCase(const GradCase& c, const std::string& splits_root,
                       std::shared_ptr<runtime::Communicator> comm);

// Activation checkpointing (Note [Activation checkpointing]): one training
// step of `c` with RunnerOptions::activation_checkpointing kFull, and with
// kEveryN 2, against the same step without it, both from the same generator seed, so dropout draws
// the same masks; every gradient this rank holds and the losses must agree
// within kCheckpointAtol. Also checks that dropout is active: a step from
// another seed must change the gradients.
inline constexpr double kCheckpointAtol = 1e-6;
CaseReport runCheckpointingCase(const GradCase& c, const std::string& splits_root,
                                std::shared_ptr<runtime::Communicator> comm);

// <build>/runtime_splits, written by tests/runtime/make_splits.py.
std::string splitsRoot();

}  // namespace pipeforge::testing
