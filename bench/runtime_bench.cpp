// Runtime benchmark: the real pipeline against the cost simulator, against
// one process, and split backward against whole backward.
//
//   pipeforge_bench_runtime [--model PATH.pt] [--small-model PATH.pt] [--split-points FQN]
//                           [--batch 32] [--microbatches 8] [--steps 10] [--schedule 1F1B]
//
// 1. I+W vs B: per stage, on this model and the zoo gpt, median over repetitions.
// 2. One process: every stage in one rank (same global batch, microbatches).
// 3. Two ranks (this executable re-started by the local launcher, one ATen
//    thread each): step times, per-action durations and the p2p latency.
//    The measured durations become a schedules::CostModel; simulateCost's
//    makespan is set beside the measured step time.
// Printed side by side: real / simulated (goal <= 1.05), speedup over one
// process vs 0.9 * m*p/(m+p-1), and (I+W)/B (goal <= 1.15); and how many
// processes this machine really runs at once, which bounds the speedup.
// Each rank's last step is broken down into compute, waits and all-reduce
// (PIPEFORGE_BENCH_TIMELINE=1 also prints every action's span). The ranks
// pin themselves as training ranks do (Note [One core range per rank]);
// PIPEFORGE_BENCH_NO_PIN=1 leaves them to the kernel, to measure the difference.
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/script.h>

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/cpu_affinity.h"
#include "common/host_memory.h"
#include "runtime/c10d_comm.h"
#include "runtime/comm_plan.h"
#include "runtime/local_launcher.h"
#include "runtime/pipeline_runner.h"
#include "runtime/pipeline_stage.h"
#include "runtime/step_profile.h"
#include "schedules/cost_model.h"
#include "schedules/generate.h"
#include "schedules/lower.h"
#include "schedules/simulate_cost.h"
#include "stage/manifest.h"
#include "stage/split_model.h"

namespace {

bool kept_freed_memory = false;  // keepFreedHostMemory() in main

using namespace pipeforge;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

struct Args {
  std::string model;
  std::string small_model;  // the zoo's tiny gpt, for (I+W)/B on it too
  std::string split_points = "blocks.2";  // where the two-stage split begins stage 1
  std::string schedule = "1F1B";
  int batch = 32;
  int microbatches = 8;
  int steps = 10;
  int vocab = 256;
  int seq = 64;
  // Internal: one rank of part 3.
  bool rank_worker = false;
  std::string split_dir;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

std::string split(const Args& a, const std::string& root, int stages) {
  std::string stem = std::filesystem::path(a.model).stem().string();
  std::string out = fmt::format("{}/{}_{}", root, stem, stages);
  std::string spec = fmt::format("{}/{}_{}.yaml", root, stem, stages);
  std::ofstream(spec) << (stages == 1 ? fmt::format("num_stages: 1\npolicy: uniform\nexample_inputs: [{{shape: [2, {}], "
                                                    "dtype: int64, high: {}}}]\n",
                                                    a.seq, a.vocab)
                                      : fmt::format("split_points:\n  {}: BEGINNING\n", a.split_points));
  stage::SplitRequest req;
  req.model_path = a.model;
  req.spec_path = spec;
  req.out_dir = out;
  req.force = true;
  stage::splitModelToDirectory(req);
  return out;
}

std::pair<at::Tensor, at::Tensor> batch(const Args& a) {
  torch::manual_seed(0);
  return {torch::randint(0, a.vocab, {a.batch, a.seq}), torch::randint(0, a.vocab, {a.batch, a.seq})};
}

runtime::RunnerOptions runnerOptions(const Args& a, const std::string& dir, const std::string& schedule) {
  runtime::RunnerOptions o;
  o.split_dir = dir;
  o.schedule = schedule;
  o.num_microbatches = a.microbatches;
  o.loss = runtime::LossKind::kCrossEntropy;
  o.profile = true;
  o.timeout = std::chrono::seconds(120);
  return o;
}

// Median step time of `runner` over the measured steps (after two warm-ups).
template <class Sync>
std::vector<double> stepTimes(runtime::PipelineRunner& runner, const Args& a, Sync sync) {
  auto [idx, tgt] = batch(a);
  std::vector<double> out;
  for (int s = 0; s < a.steps + 2; ++s) {
    sync();
    runner.zeroGrad();
    auto t0 = Clock::now();
    runner.trainStep({idx}, {tgt});
    if (s >= 2) out.push_back(seconds(t0, Clock::now()));
  }
  return out;
}

// ---- 1. I+W vs B -------------------------------------------------------------

struct SplitCost {
  double b = 0, i = 0, w = 0;
};

// B, I and W of every stage of the split in `dir`, on one microbatch of
// token ids (each stage fed its predecessor's output), median of `reps`.
std::vector<SplitCost> splitBackwardCosts(const std::string& dir, const at::Tensor& idx, int reps) {
  stage::PipeManifest manifest = stage::readManifest(dir);
  runtime::CommPlan plan = runtime::buildCommPlan(manifest);
  std::vector<SplitCost> costs;
  std::vector<std::vector<at::Tensor>> outputs;
  for (int s = 0; s < manifest.num_stages; ++s) {
    runtime::PipelineStage st = runtime::PipelineStage::fromSplit(dir, manifest, plan, s, "cpu");
    std::vector<at::Tensor> inputs;
    for (const auto& in : plan.stages[s].inputs) {
      if (in.kind == runtime::StageInput::Kind::kRoot) {
        inputs.push_back(idx);
      } else {
        const runtime::Edge& e = plan.edges[in.edge];
        inputs.push_back(outputs[e.producer][e.producer_output]);
      }
    }
    std::vector<double> b, i, w;
    for (int r = 0; r < reps; ++r) {
      for (bool split_bw : {false, true}) {
        auto outs = st.forward(0, inputs, true);
        std::vector<at::Tensor> grads;
        for (const auto& o : outs) grads.push_back(torch::ones_like(o));
        auto t0 = Clock::now();
        if (!split_bw) {
          st.backward(0, grads);
          b.push_back(seconds(t0, Clock::now()));
        } else {
          st.backwardInput(0, grads);
          auto t1 = Clock::now();
          st.backwardWeight(0);
          i.push_back(seconds(t0, t1));
          w.push_back(seconds(t1, Clock::now()));
        }
        st.zeroGrad();
      }
    }
    costs.push_back({median(b), median(i), median(w)});
    outputs.push_back(st.forward(0, inputs, false));
  }
  return costs;
}

void printSplitCosts(const std::string& what, const std::vector<SplitCost>& costs) {
  for (std::size_t s = 0; s < costs.size(); ++s) {
    const SplitCost& c = costs[s];
    fmt::print("   {} stage {}: B {:.3f} ms | I {:.3f} + W {:.3f} = {:.3f} ms | (I+W)/B = {:.3f}\n", what, s,
               c.b * 1e3, c.i * 1e3, c.w * 1e3, (c.i + c.w) * 1e3, (c.i + c.w) / c.b);
  }
}

// ---- 3. one rank of the two-rank run -------------------------------------------

int rankWorker(const Args& a) {
  // As every training rank on the CPU does (launch/launch.cpp), on the
  // CPUs the driver reserved: Note [One core range per rank].
  const CpuPinning pin = pinRankToCpus();
  at::set_num_threads(1);
  runtime::C10dCommOptions co;
  co.env = runtime::resolveDistEnv({});
  co.timeout = std::chrono::seconds(120);
  std::shared_ptr<runtime::Communicator> comm = runtime::connectC10d(co);
  runtime::PipelineRunner runner(runnerOptions(a, a.split_dir, a.schedule), comm);

  // p2p latency of one activation-sized message (half a round trip), the
  // median of 30 after a barrier and 5 unmeasured ones: without them the
  // median also held the peer's late start and the first messages' setup
  // (0.1 to 1.8 ms over runs, against a steady 0.1 ms).
  at::Tensor msg = torch::zeros({a.batch / a.microbatches, a.seq, 64});
  std::vector<double> rtt;
  comm->barrier();
  constexpr int kUnmeasured = 5, kMeasured = 30;
  for (int k = 0; k < kUnmeasured + kMeasured; ++k) {
    auto t0 = Clock::now();
    if (comm->rank() == 0) {
      comm->isend(msg, 1, 900000 + k)->wait();
      comm->irecv(msg, 1, 900000 + k)->wait();
    } else {
      comm->irecv(msg, 0, 900000 + k)->wait();
      comm->isend(msg, 0, 900000 + k)->wait();
    }
    if (k >= kUnmeasured) rtt.push_back(seconds(t0, Clock::now()));
  }

  json out;
  out["rank"] = comm->rank();
  out["cpus"] = pin.cpus.empty() ? std::string("any") : cpuListText(pin.cpus);
  out["latency_s"] = median(rtt) / 2;
  out["steps"] = stepTimes(runner, a, [&] { comm->barrier(); });
  json actions = json::array();
  for (const auto& t : runner.lastProfile().steps) {
    actions.push_back({{"action", schedules::formatAction(t.action)}, {"s", t.end_s - t.start_s - t.wait_s}});
  }
  out["actions"] = actions;
  // Where the last step's time went on this rank (Note [Trace slice kinds]).
  const runtime::StepProfile& last = runner.lastProfile();
  double compute = 0;
  for (const auto& t : last.steps) compute += t.end_s - t.start_s - t.wait_s;
  json spans = json::object();
  for (const auto& sp : last.spans) {
    std::string kind = runtime::spanKindName(sp.kind);
    spans[kind] = spans.value(kind, 0.0) + (sp.end_s - sp.start_s);
  }
  out["breakdown"] = {{"step_s", last.step_s}, {"compute_s", compute}, {"spans_s", spans}};
  json tl = json::array();
  for (const auto& t : last.steps)
    tl.push_back({schedules::formatAction(t.action), t.start_s * 1e3, t.end_s * 1e3, t.wait_s * 1e3});
  for (const auto& sp : last.spans) {
    if (sp.kind != runtime::SpanKind::kSend && sp.kind != runtime::SpanKind::kWait) continue;
    tl.push_back({sp.name, sp.start_s * 1e3, sp.end_s * 1e3, 0.0});
  }
  std::sort(tl.begin(), tl.end(), [](const json& x, const json& y) { return x[1].get<double>() < y[1].get<double>(); });
  out["timeline"] = tl;
  std::cout << "PROFILE " << out.dump() << std::endl;
  runner.barrier();
  return 0;
}

// How many of `ranks` CPU-bound processes really run at once here: `ranks`
// times one spin's time over the time of `ranks` spins started together
// (shared or throttled machines give less than `ranks`).
double cpuParallelism(int ranks) {
  auto spin = [&](int n) {
    runtime::LaunchOptions o;
    o.executable = "/bin/sh";
    o.args = {"-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"};
    o.num_ranks = n;
    auto t0 = Clock::now();
    runtime::launchLocal(o);
    return seconds(t0, Clock::now());
  };
  double one = spin(1);
  return ranks * one / spin(ranks);
}

// ---- driver ------------------------------------------------------------------

int run(const Args& a, const char* self) {
  at::set_num_threads(1);
  std::string root = (std::filesystem::temp_directory_path() / "pipeforge-runtime-bench").string();
  std::filesystem::create_directories(root);
  std::string one = split(a, root, 1), two = split(a, root, 2);
  auto [idx, tgt] = batch(a);
  (void)tgt;
  int p = 2, m = a.microbatches;
  fmt::print("model {} | batch {}x{} | {} microbatches | split before {} | {} steps measured\n", a.model, a.batch,
             a.seq, m, a.split_points, a.steps);
  fmt::print("host malloc: {} (Note [Freed memory stays in the process])\n\n",
             kept_freed_memory ? "keeps freed memory, as training ranks do" : "left as the environment set it");

  // 1. I+W vs B on one microbatch of each stage. A first stage fed token ids
  // has no input gradient (I is empty); the later stages show the split.
  at::Tensor mb_idx = idx.narrow(0, 0, a.batch / m);
  fmt::print("1. split backward (one microbatch of {} sequences, median of 15)\n", a.batch / m);
  std::vector<SplitCost> stage_costs = splitBackwardCosts(two, mb_idx, 15);
  printSplitCosts("this model", stage_costs);
  SplitCost zoo_gpt{};
  if (!a.small_model.empty()) {
    Args small = a;
    small.model = a.small_model;
    small.split_points = "blocks.1";
    std::string small_dir = split(small, root, 2);
    torch::manual_seed(1);
    auto small_costs = splitBackwardCosts(small_dir, torch::randint(0, 64, {4, 16}), 15);
    printSplitCosts("zoo gpt", small_costs);
    zoo_gpt = small_costs.back();
  }
  const SplitCost& deep = stage_costs.back();
  fmt::print("\n");

  // 2. One process.
  runtime::PipelineRunner single(runnerOptions(a, one, "GPipe"));
  double t1 = median(stepTimes(single, a, [] {}));
  fmt::print("2. one process, every stage, GPipe over {} microbatches: step {:.2f} ms\n\n", m, t1 * 1e3);

  // 3. Two ranks.
  runtime::LaunchOptions lo;
  lo.executable = self;
  lo.args = {"--rank-worker", "--split-dir", two, "--schedule", a.schedule, "--batch", std::to_string(a.batch),
             "--microbatches", std::to_string(m), "--steps", std::to_string(a.steps), "--model", a.model};
  lo.num_ranks = p;
  lo.env = {{"OMP_NUM_THREADS", "1"}};
  // A core per rank, as `pipeforge train --nproc` reserves them, unless
  // PIPEFORGE_BENCH_NO_PIN is set (to measure the difference).
  CpuReservation cpus;
  if (std::getenv("PIPEFORGE_BENCH_NO_PIN") == nullptr) {
    cpus = CpuReservation::take(allowedCpus(), p);
    lo.env.push_back({kRankCpusVariable, cpuListText(cpus.cpus())});
    lo.env.push_back({kRankCpusReasonVariable, cpus.reason()});
  }
  runtime::LaunchResult lr = runtime::launchLocal(lo);
  if (!lr.ok()) {
    std::cerr << "two-rank run failed:\n" << lr.summary();
    return 1;
  }
  std::vector<json> profiles;
  for (const auto& r : lr.ranks) {
    auto pos = r.output.find("PROFILE ");
    if (pos == std::string::npos) {
      std::cerr << "rank " << r.rank << " printed no profile:\n" << r.output;
      return 1;
    }
    profiles.push_back(json::parse(r.output.substr(pos + 8, r.output.find('\n', pos) - pos - 8)));
  }
  std::vector<double> step2;
  for (std::size_t s = 0; s < profiles[0]["steps"].size(); ++s) {
    double worst = 0;
    for (const auto& pr : profiles) worst = std::max(worst, pr["steps"][s].get<double>());
    step2.push_back(worst);
  }
  double t2 = median(step2);

  // Measured costs -> CostModel (per stage medians; B as measured).
  stage::PipeManifest manifest = stage::readManifest(two);
  std::map<std::pair<int, char>, std::vector<double>> durations;
  for (const auto& pr : profiles) {
    for (const auto& a2 : pr["actions"]) {
      schedules::Action act = schedules::parseAction(a2["action"].get<std::string>());
      char kind = act.type == schedules::ActionType::kForward          ? 'F'
                  : act.type == schedules::ActionType::kFullBackward   ? 'B'
                  : act.type == schedules::ActionType::kBackwardInput  ? 'I'
                  : act.type == schedules::ActionType::kBackwardWeight ? 'W'
                                                                       : 0;
      if (kind) durations[{act.stage, kind}].push_back(a2["s"].get<double>());
    }
  }
  schedules::CostModel costs;
  costs.stages.clear();
  for (int s = 0; s < manifest.num_stages; ++s) {
    schedules::StageCost c;
    c.forward = median(durations[{s, 'F'}]) * 1e3;
    double b = median(durations[{s, 'B'}]) * 1e3;
    double i = median(durations[{s, 'I'}]) * 1e3, w = median(durations[{s, 'W'}]) * 1e3;
    c.backward_input = i > 0 ? i : b / 2;
    c.backward_weight = w > 0 ? w : b / 2;
    if (b > 0) c.full_backward = b;
    costs.stages.push_back(c);
    fmt::print("   stage {}: F {:.3f} ms, B {:.3f} ms{}\n", s, c.forward, c.fullBackward(),
               i > 0 ? fmt::format(", I {:.3f}, W {:.3f}", i, w) : "");
  }
  // Where each rank's last step went. Sends are posted inside the action
  // that made the value, so their time is part of its compute; waits are not.
  for (const auto& pr : profiles) {
    const json& b = pr["breakdown"];
    auto span = [&](const char* kind) { return b["spans_s"].value(kind, 0.0) * 1e3; };
    const double step = b["step_s"].get<double>() * 1e3, compute = b["compute_s"].get<double>() * 1e3;
    fmt::print("   rank {} (CPUs {}), last step {:.2f} ms: compute {:.2f} (posting sends {:.2f} of it), waits {:.2f}, "
               "all-reduce {:.2f}, the rest {:.2f}\n",
               pr["rank"].get<int>(), pr["cpus"].get<std::string>(), step, compute, span("comm"), span("wait"),
               span("all-reduce"), step - compute - span("wait") - span("all-reduce"));
    if (std::getenv("PIPEFORGE_BENCH_TIMELINE")) {
      for (const auto& t : pr["timeline"]) {
        fmt::print("      {:>30} {:8.2f} .. {:8.2f} ms, waiting {:6.2f}\n", t[0].get<std::string>(), t[1].get<double>(),
                   t[2].get<double>(), t[3].get<double>());
      }
    }
  }
  double latency = 0;
  for (const auto& pr : profiles) latency = std::max(latency, pr["latency_s"].get<double>());
  costs.comm_latency = latency * 1e3;
  runtime::RunnerOptions ro = runnerOptions(a, two, a.schedule);
  schedules::ScheduleConfig sc{p, 1, m};
  schedules::Program program = schedules::lowerForExecution(schedules::generateSchedule(a.schedule, sc));
  double makespan = schedules::simulateCost(program, costs).makespan / 1e3;

  double ideal = static_cast<double>(m * p) / (m + p - 1);
  double cores = cpuParallelism(p);
  fmt::print("3. two ranks, {}: step {:.2f} ms (comm latency {:.3f} ms)\n\n", a.schedule, t2 * 1e3, latency * 1e3);
  fmt::print("{:<44} {:>10} {:>10}\n", "", "measured", "goal");
  fmt::print("{:<44} {:>10.3f} {:>10}\n", "real step / simulated makespan", t2 / makespan, "<= 1.05");
  fmt::print("{:<44} {:>10.3f} {:>10.3f}\n", "speedup 2 ranks over 1 process", t1 / t2, 0.9 * ideal);
  fmt::print("{:<44} {:>10.3f} {:>10}\n", "(I+W) / B, last stage of this model", (deep.i + deep.w) / deep.b,
             "<= 1.15");
  if (zoo_gpt.b > 0) {
    fmt::print("{:<44} {:>10.3f} {:>10}\n", "(I+W) / B, last stage of the zoo gpt", (zoo_gpt.i + zoo_gpt.w) / zoo_gpt.b,
               "<= 1.15");
  }
  fmt::print("   (simulated makespan {:.2f} ms; ideal speedup m*p/(m+p-1) = {:.3f})\n", makespan * 1e3, ideal);
  fmt::print("   CPU parallelism measured here: {:.2f} of {} processes run at once{}\n", cores, p,
             cores < 0.9 * p ? "; the speedup goal assumes a free core per rank, which this machine lacks" : "");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // As every training rank does (train/trainer.cpp, trainRank); the
  // two-rank workers are this executable too.
  kept_freed_memory = pipeforge::keepFreedHostMemory();
  Args a;
#ifdef PIPEFORGE_ZOO_DIR
  a.model = std::string(PIPEFORGE_ZOO_DIR) + "/gpt_demo.pt";
  a.small_model = std::string(PIPEFORGE_ZOO_DIR) + "/gpt.pt";
#endif
  for (int k = 1; k < argc; ++k) {
    std::string f = argv[k];
    auto next = [&]() -> std::string {
      if (k + 1 >= argc) throw std::invalid_argument(f + " needs a value");
      return argv[++k];
    };
    if (f == "--model") a.model = next();
    else if (f == "--small-model") a.small_model = next();
    else if (f == "--split-points") a.split_points = next();
    else if (f == "--schedule") a.schedule = next();
    else if (f == "--batch") a.batch = std::stoi(next());
    else if (f == "--microbatches") a.microbatches = std::stoi(next());
    else if (f == "--steps") a.steps = std::stoi(next());
    else if (f == "--rank-worker") a.rank_worker = true;
    else if (f == "--split-dir") a.split_dir = next();
    else {
      std::cerr << "unknown flag " << f << "\n";
      return 2;
    }
  }
  try {
    if (a.rank_worker) return rankWorker(a);
    if (a.model.empty()) {
      std::cerr << "pass --model PATH.pt (a GPT-like zoo model, e.g. <build>/zoo/gpt_demo.pt)\n";
      return 2;
    }
    return run(a, std::filesystem::read_symlink("/proc/self/exe").c_str());
  } catch (const std::exception& e) {
    std::cerr << "runtime bench: " << e.what() << "\n";
    return 1;
  }
}
