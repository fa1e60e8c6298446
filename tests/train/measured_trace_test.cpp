// Note [Trace slice kinds] on real runs of `pipeforge train` with
// output.trace: waits are their own slices, compute slices hold only
// compute, and every step shows its optimizer step and all-reduces.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tests/train/train_fixture.h"

namespace pipeforge::testing {
namespace {

// Times in the trace are rounded to 0.001 us each (ts and dur apart), so two
// slices that touch may seem to overlap by that much.
constexpr double kRoundingUs = 0.01;

struct Slice {
  std::string name, cat;
  int rank = 0;
  double ts = 0.0, end = 0.0;  // microseconds
  std::int64_t step = -1;      // the training step whose step slice holds it
  std::int64_t bytes = 0;      // args.bytes: a send's payload
};

bool isCompute(const std::string& cat) {
  return cat == "F" || cat == "B" || cat == "I" || cat == "W" || cat == "OVERLAP_F_B";
}

// Every event of a measured trace is a complete ("X") slice with ts/dur in
// microseconds on pid 0, tid = rank; each non-step slice falls inside one step.
struct Trace {
  nlohmann::json other;
  std::vector<Slice> steps, slices;  // step slices; all the others

  std::vector<const Slice*> of(int rank, std::int64_t step, const std::string& cat) const {
    std::vector<const Slice*> out;
    for (const Slice& s : slices) {
      if (s.rank == rank && s.step == step && s.cat == cat) out.push_back(&s);
    }
    return out;
  }
};

Trace readTrace(const std::string& path, int ranks) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "no trace at " << path;
  const nlohmann::json trace = nlohmann::json::parse(in);
  Trace out;
  out.other = trace.at("otherData");
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M") continue;
    EXPECT_EQ(e.at("ph"), "X") << e.dump();
    EXPECT_EQ(e.at("pid"), 0) << e.dump();
    Slice s;
    s.name = e.at("name").get<std::string>();
    s.cat = e.at("cat").get<std::string>();
    s.rank = e.at("tid").get<int>();
    s.ts = e.at("ts").get<double>();
    if (e.contains("args") && e.at("args").contains("bytes")) s.bytes = e.at("args").at("bytes").get<std::int64_t>();
    EXPECT_GE(s.rank, 0);
    EXPECT_LT(s.rank, ranks);
    const double dur = e.at("dur").get<double>();
    EXPECT_GE(dur, 0.0) << e.dump();
    s.end = s.ts + dur;
    if (s.cat == "step") {
      s.step = e.at("args").at("training_step").get<std::int64_t>();
      out.steps.push_back(s);
    } else {
      out.slices.push_back(s);
    }
  }
  for (Slice& s : out.slices) {
    const double mid = (s.ts + s.end) / 2;
    for (const Slice& step : out.steps) {
      if (step.rank == s.rank && step.ts <= mid && mid <= step.end) s.step = step.step;
    }
    EXPECT_GE(s.step, 0) << "slice '" << s.name << "' on rank " << s.rank << " at " << s.ts << " us lies in no step";
  }
  return out;
}

// What holds for every traced step of every rank, whatever the layout.
void expectTruthfulSteps(const Trace& t, int ranks, std::int64_t first_step, std::int64_t last_step) {
  EXPECT_EQ(t.other.at("first_step"), first_step);
  EXPECT_EQ(t.other.at("last_step"), last_step);
  EXPECT_EQ(t.steps.size(), static_cast<std::size_t>(ranks * (last_step - first_step + 1)));
  for (const Slice& step : t.steps) {
    std::vector<const Slice*> inside;
    for (const Slice& s : t.slices) {
      if (s.rank == step.rank && s.step == step.step) inside.push_back(&s);
    }
    std::sort(inside.begin(), inside.end(), [](const Slice* a, const Slice* b) { return a->ts < b->ts; });
    // No two slices of a rank overlap: compute never covers a wait, a
    // collective or the optimizer, nor they each other.
    double sum = 0.0;
    for (std::size_t k = 0; k < inside.size(); ++k) {
      sum += inside[k]->end - inside[k]->ts;
      if (k == 0) continue;
      EXPECT_LE(inside[k - 1]->end, inside[k]->ts + kRoundingUs)
          << "rank " << step.rank << " step " << step.step << ": '" << inside[k - 1]->name << "' ["
          << inside[k - 1]->ts << ", " << inside[k - 1]->end << ") overlaps '" << inside[k]->name << "' ["
          << inside[k]->ts << ", " << inside[k]->end << ")";
    }
    EXPECT_LE(sum, step.end - step.ts + kRoundingUs * static_cast<double>(inside.size()))
        << "rank " << step.rank << " step " << step.step << ": its slices add up to more than its wall time";
    EXPECT_EQ(t.of(step.rank, step.step, "optimizer").size(), 1u) << "rank " << step.rank << " step " << step.step;
    int gradient_checks = 0;
    for (const Slice* s : t.of(step.rank, step.step, "check")) gradient_checks += s->name == "gradient check";
    EXPECT_EQ(gradient_checks, 1) << "rank " << step.rank << " step " << step.step;
  }
}

// The data-parallel all-reduces of a rank's step ("all-reduce grads stage ...").
std::size_t gradientAllReduces(const Trace& t, int rank, std::int64_t step) {
  std::size_t n = 0;
  for (const Slice* s : t.of(rank, step, "all-reduce")) n += s->name.rfind("all-reduce grads stage", 0) == 0;
  return n;
}

// The rank whose track holds a slice called `name`.
int rankRunning(const Trace& t, const std::string& name) {
  for (const Slice& s : t.slices) {
    if (s.name == name) return s.rank;
  }
  ADD_FAILURE() << "no slice '" << name << "' in the trace";
  return -1;
}

TEST(MeasuredTrace, TwoRank1F1BShowsItsWaits) {
  TrainWorkspace ws;
  RunSpec spec;
  spec.split = "num_stages: 2\n  policy: parameters";  // wte on stage 0, the tied lm_head on stage 1
  spec.steps = 3;
  spec.output = ", trace: true, trace_steps: 2";
  auto run = runPipeforge(fmt::format("train --config '{}' --nproc 2", ws.writeConfig("trace", spec)));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const Trace t = readTrace(ws.outDir("trace") + "/trace.json", 2);
  expectTruthfulSteps(t, 2, 2, 3);

  const int first = rankRunning(t, "0F0"), last = rankRunning(t, "1F0");
  ASSERT_NE(first, last);
  for (std::int64_t step : {2, 3}) {
    for (int rank : {first, last}) {
      EXPECT_EQ(gradientAllReduces(t, rank, step), 0u) << "data_parallel is 1";
      // The tied wte/lm_head sit on both ranks: their gradients are summed.
      EXPECT_EQ(t.of(rank, step, "all-reduce").size(), 1u) << "rank " << rank << " step " << step;
    }
    // The last stage's first forward waits for its input from the first stage...
    const std::string wait_name = fmt::format("wait recv 1F0 from rank {}", first);
    const Slice* wait = nullptr;
    for (const Slice* w : t.of(last, step, "wait")) {
      if (w->name == wait_name) wait = w;
    }
    ASSERT_NE(wait, nullptr) << "step " << step << ": no '" << wait_name << "'";
    // ... and computes right after it, with no other compute before it ...
    bool resumed = false;
    for (const Slice& s : t.slices) {
      if (s.rank != last || s.step != step || !isCompute(s.cat)) continue;
      if (s.ts < wait->end - kRoundingUs) {
        EXPECT_EQ(s.name, "1F0") << "step " << step << ": compute before the first forward's input arrived";
      }
      resumed |= s.name == "1F0" && std::abs(s.ts - wait->end) <= kRoundingUs;
    }
    EXPECT_TRUE(resumed) << "step " << step << ": no 1F0 compute slice starts where its wait ends (" << wait->end
                         << " us)";
    // ... which cannot end before the first stage posted the send, after
    // its compute of 0F0 (one host, one clock).
    const Slice* send = nullptr;
    for (const Slice* s : t.of(first, step, "comm")) {
      if (s->name == fmt::format("send 0F0 to rank {}", last)) send = s;
    }
    ASSERT_NE(send, nullptr) << "step " << step;
    EXPECT_GE(wait->end, send->ts) << "step " << step;
    // The send says what it carries: the hidden states, 4 bytes an element; a wait carries nothing.
    EXPECT_GT(send->bytes, 0) << "step " << step;
    EXPECT_EQ(send->bytes % 4, 0) << "step " << step;
    EXPECT_EQ(wait->bytes, 0) << "step " << step;
    bool computed = false;
    for (const Slice* f : t.of(first, step, "F")) {
      computed |= f->name == "0F0" && std::abs(f->end - send->ts) <= kRoundingUs;
    }
    EXPECT_TRUE(computed) << "step " << step << ": no 0F0 compute slice ends where its send begins";
  }
}

TEST(MeasuredTrace, DataParallelAllReduceOncePerRankAndStep) {
  TrainWorkspace ws;
  RunSpec spec;
  spec.model = "mlp";
  spec.split = "num_stages: 2\n  policy: parameters";
  spec.data_parallel = 2;
  spec.microbatches = 2;
  spec.steps = 3;
  spec.output = ", trace: true, trace_steps: 2";
  auto run = runPipeforge(fmt::format("train --config '{}' --nproc 4", ws.writeConfig("trace_dp", spec)));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const Trace t = readTrace(ws.outDir("trace_dp") + "/trace.json", 4);
  expectTruthfulSteps(t, 4, 2, 3);
  for (std::int64_t step : {2, 3}) {
    for (int rank = 0; rank < 4; ++rank) {
      EXPECT_EQ(gradientAllReduces(t, rank, step), 1u) << "rank " << rank << " step " << step;
      EXPECT_EQ(t.of(rank, step, "all-reduce").size(), 1u) << "the mlp ties no weights";
    }
  }
}

}  // namespace
}  // namespace pipeforge::testing
