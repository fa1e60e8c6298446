"""Pipeforge against torch.distributed.pipelining, side by side in one run (issues 11, 28).

For every model x layout both sides train the same weights, cut at the same
FQNs, with the same schedule, microbatches, batch rows, AdamW settings and
implementation (--adamw), ranks (Gloo on 127.0.0.1) and intra-op threads per
rank; then one table row:

  step ms     median over the steps after warm-up of rank 0's step time
  PF/PT       the ratio of the two medians
  peak RSS    per rank, MiB (VmHWM)
  1st step s  from the start of the processes to the end of step 1, the split
              included (Pipeforge: `pipeforge split` + `pipeforge train` until
              step 1 ends; PyTorch: import, pipeline(), build_stage, step 1)
  CPU par.    CPU seconds of all ranks / wall seconds over the timed steps
  CPU s/step  CPU seconds of all ranks per timed step: the work done, which
              background load on the machine moves much less than wall time,
              and its ratio PF/PT
  loss@1      the step-1 loss of each side (same weights and rows: equal up
              to float rounding; a sanity check that both train the same thing)

Then, unless --no-best, each side's best at P ranks (layout "Pr-best", P from
--best-ranks): Pipeforge splits the model itself into 2P stages (`num_stages`
+ `policy: cost`) and trains with `pipeline.schedule: auto`, 2 stages per rank;
PyTorch runs each of GPipe and 1F1B (the P-stage cuts of the layout rows) and
Interleaved1F1B, InterleavedZeroBubble (loop placement), ZBVZeroBubble and
DualPipeV (V placement) at the 2P cuts Pipeforge's split made, and its fastest
one is its best. One line per PyTorch schedule, then one row: PF best, PT
best, PF/PT, the limit (M x sum over stages of F+I+W / P, from the per-stage
costs auto measured: a zero-bubble, perfectly balanced run of them) and
PF best / limit.

Goals: Pipeforge step <= 0.8x PyTorch's on the GPT models (issue 11) and the
Llama against its hand-made PyTorch split (issue 45), and on gpt24 for the best rows at 2 and 4 ranks (issue 28); Pipeforge's peak RSS <=
PyTorch's on every rank; CPU s/step PF/PT <= 0.9 on every row; PF best within
5% of the limit (<= 1.05x) on gpt24 at 2 ranks. Each row says whether they
hold. Run through run.sh; `--help` lists the options.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "interop"))

import torch  # noqa: E402

import interop_common  # noqa: E402  (batch_rows: the rows `data.format: tensors` draws per step)
import models  # noqa: E402
import pipeforge_side  # noqa: E402
import torch_side  # noqa: E402

# layout name -> (ranks, schedule, stages per rank[, tensor parallel]); more than one stage per rank: the V
# placement. A tensor-parallel layout runs ranks / tp pipeline ranks, on the models of TP_MODELS only.
LAYOUTS = {
    "1r-ZBV": (1, "ZBVZeroBubble", 2),  # one process with both stages (the GPU check's second shape)
    "2r-1F1B": (2, "1F1B", 1),
    "2r-ZBV": (2, "ZBVZeroBubble", 2),
    "4r-ZBV": (4, "ZBVZeroBubble", 2),
    "4r-pp2tp2": (4, "1F1B", 1, 2),
}
# The GPT models fuse q, k and v in one Linear, which tensor parallel refuses; the Llama splits.
TP_MODELS = ("llama",)
# PyTorch's side of a tensor-parallel row: the manual stages, whose layers DTensor's parallelize_module splits
# over the tp dimension of a (pp, tp) DeviceMesh, as torchtitan does (torch_rank.py).
# PyTorch's named schedules tried for its best: (schedule, stages per rank, placement).
# One stage per rank: the P-stage cuts of models.cuts; two: the 2P cuts of Pipeforge's best split.
BEST_SCHEDULES = (
    ("GPipe", 1, "loop"),
    ("1F1B", 1, "loop"),
    ("Interleaved1F1B", 2, "loop"),
    ("InterleavedZeroBubble", 2, "loop"),
    ("ZBVZeroBubble", 2, "v"),
    ("DualPipeV", 2, "v"),
)
BEST_STAGES_PER_RANK = 2
STEP_GOAL_MODELS = ("gpt_demo", "gpt24", "llama")  # the Llama against its hand-made split (issue 45)
STEP_GOAL = 0.8
BEST_STEP_GOAL_ROWS = (("gpt24", 2), ("gpt24", 4))  # PF best <= 0.8x PT best
LIMIT_GOAL = 1.05
LIMIT_GOAL_ROWS = (("gpt24", 2),)                   # PF best <= 1.05x the limit
CPU_GOAL = 0.9                                      # CPU s/step PF/PT, every row
SEED = 1337
OPTIMIZER = {"lr": 1.0e-3, "betas": [0.9, 0.95], "eps": 1.0e-8, "weight_decay": 0.01}
# --adamw -> (PyTorch, Pipeforge) spelling, for the header line
ADAMW = {"loop": ("foreach=False", "optimizer without foreach/fused: LibTorch's per-parameter loop"),
         "foreach": ("foreach=True", "optimizer.foreach: true"),
         "fused": ("fused=True", "optimizer.fused: true")}
GOAL = {True: "held", False: "NO", None: "n/a"}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pipeforge", default=os.environ.get("PIPEFORGE", "build/cli/pipeforge"))
    p.add_argument("--zoo", default="build/zoo", help="folder with gpt_demo.pt")
    p.add_argument("--models", default=",".join(models.MODELS), help=f"comma list of {', '.join(models.MODELS)}")
    p.add_argument("--layouts", default=",".join(lay for lay in LAYOUTS if LAYOUTS[lay][0] > 1),
                   help=f"comma list of {', '.join(LAYOUTS)} (default: all but 1r-ZBV)")
    p.add_argument("--best", action=argparse.BooleanOptionalAction, default=True,
                   help="also run each side's best (rows Pr-best): Pipeforge's cost split + schedule auto, PyTorch's "
                        "fastest named schedule at the same cuts (default: on; --no-best skips them)")
    p.add_argument("--best-ranks", default="",
                   help="comma list of rank counts for the best rows (default: the ranks of --layouts)")
    p.add_argument("--adamw", choices=tuple(ADAMW), default="fused",
                   help="AdamW implementation, the same on both sides: loop (PyTorch foreach=False, Pipeforge's "
                        "default), foreach, fused (default)")
    p.add_argument("--steps", type=int, default=15, help="optimizer steps per run, warm-up included")
    p.add_argument("--warmup", type=int, default=4, help="steps left out of the median")
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--batch", type=int, default=32, help="rows per step (global batch)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank, both sides")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu (Gloo), or cuda: every rank on GPU 0 over NCCL, both sides; the rows then add each "
                        "rank's torch.cuda.max_memory_allocated")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="bf16: each stage's forward and the loss under autocast, fp32 parameters and optimizer, "
                        "both sides (Pipeforge's training.precision)")
    p.add_argument("--quick", action="store_true", help="smoke run: gpt_demo on 2r-1F1B (and 2r-best), 6 steps "
                                                         "(2 warm-up)")
    p.add_argument("--work", default="", help="scratch folder (default: a new one under /tmp, removed after)")
    p.add_argument("--json", default="", help="also write every measurement to this file")
    a = p.parse_args()
    if a.quick:
        a.models, a.layouts, a.steps, a.warmup = "gpt_demo", "2r-1F1B", 6, 2
    a.models, a.layouts = a.models.split(","), [lay for lay in a.layouts.split(",") if lay]
    for m in a.models:
        if m not in models.MODELS:
            p.error(f"unknown model '{m}'; known: {', '.join(models.MODELS)}")
    for lay in a.layouts:
        if lay not in LAYOUTS:
            p.error(f"unknown layout '{lay}'; known: {', '.join(LAYOUTS)}")
    try:
        a.best_ranks = (sorted({int(r) for r in a.best_ranks.split(",")}) if a.best_ranks
                        else sorted({LAYOUTS[lay][0] for lay in a.layouts if len(LAYOUTS[lay]) < 4 and LAYOUTS[lay][0] > 1}))
    except ValueError:
        p.error(f"--best-ranks {a.best_ranks}: not a comma list of integers")
    if any(r < 2 for r in a.best_ranks):
        p.error(f"--best-ranks {a.best_ranks}: a pipeline needs 2 ranks or more")
    if not a.best:
        a.best_ranks = []
    if not a.layouts and not a.best_ranks:
        p.error("nothing to run: no --layouts, and no best rows (--no-best or no --best-ranks)")
    if a.steps - a.warmup < 3 or a.warmup < 1:
        p.error(f"--steps {a.steps} --warmup {a.warmup}: need warm-up >= 1 and >= 3 timed steps")
    if a.batch % a.microbatches:
        p.error(f"--batch {a.batch} is not a multiple of --microbatches {a.microbatches}")
    if not os.access(a.pipeforge, os.X_OK):
        p.error(f"no pipeforge binary at {a.pipeforge}; build it or set PIPEFORGE")
    return a


def mib(kib) -> str:
    return "?" if kib is None else f"{kib / 1024:.0f}"


def median_ms(step_s: list, warmup: int) -> float:
    return statistics.median(step_s[warmup:]) * 1e3


def summarize(model: str, layout: str, pf: dict, pt, warmup: int) -> dict:
    """One row. `pt` is None when the PyTorch side could not train the model
    (its error is kept in the row): only Pipeforge's columns are filled."""
    pf_ms = median_ms(pf["step_s"], warmup)
    s = {"model": model, "layout": layout, "pf_ms": pf_ms, "pf_rss": pf["peak_kib"], "pf_first": pf["first_step_s"],
         "pf_split": pf["split_s"], "pf_par": pf["parallelism"], "pf_cpu": pf["cpu_per_step"],
         "pf_loss": pf["first_loss"], "pf_steps": pf["step_s"], "pt_error": None}
    if pt is None:
        return dict(s, pt_ms=None, ratio=None, pt_rss=None, pt_first=None, pt_par=None, pt_cpu=None, pt_loss=None,
                    cpu_ratio=None, step_ok=None, rss_ok=None, cpu_ok=None, pt_steps=None)
    pt_ms = median_ms(pt["step_s"], warmup)
    ratio = pf_ms / pt_ms
    cpu_ratio = pf["cpu_per_step"] / pt["cpu_per_step"]
    rss_ok = all(a is not None and b is not None and a <= b for a, b in zip(pf["peak_kib"], pt["peak_kib"]))
    step_ok = ratio <= STEP_GOAL if model in STEP_GOAL_MODELS else None
    pf_gpu, pt_gpu = pf.get("gpu_mib") or [], pt.get("gpu_mib") or []
    gpu = any(v is not None for v in pf_gpu + pt_gpu)
    gpu_ok = (all(a is not None and b is not None and a <= b for a, b in zip(pf_gpu, pt_gpu)) if gpu else None)
    return dict(s, pt_ms=pt_ms, ratio=ratio, pt_rss=pt["peak_kib"], pt_first=pt["first_step_s"],
                pt_par=pt["parallelism"], pt_cpu=pt["cpu_per_step"], pt_loss=pt["first_loss"], cpu_ratio=cpu_ratio,
                step_ok=step_ok, rss_ok=rss_ok, cpu_ok=cpu_ratio <= CPU_GOAL, pt_steps=pt["step_s"],
                pf_gpu=pf_gpu if gpu else None, pt_gpu=pt_gpu if gpu else None, gpu_ok=gpu_ok)


def torch_error(e: Exception) -> str:
    """The exception line a failed PyTorch rank ended with (its log's last 'Error:' line)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error:" in ln or "Exception:" in ln]
    return (errors or lines or ["(no output)"])[-1]


HEADER = (f"{'model':9s} {'layout':8s} | {'step ms PF':>10s} {'PT':>7s} {'PF/PT':>6s} | {'peak RSS MiB/rank PF':>20s} "
          f"{'PT':>16s} | {'1st step s PF (split)':>21s} {'PT':>6s} | {'CPU par PF':>10s} {'PT':>5s} | "
          f"{'CPU s/step PF':>13s} {'PT':>6s} {'PF/PT':>6s} | "
          f"{'loss@1 PF':>9s} {'PT':>7s} | {'step<=0.8x':10s} {'RSS<=PT':7s} {'CPU<=0.9x':9s}")


def row(s: dict) -> str:
    first_pf = f"{s['pf_first']:.2f} ({s['pf_split']:.2f})"
    pf_cols = (f"{s['model']:9s} {s['layout']:8s} | {s['pf_ms']:10.1f}", f"{'/'.join(map(mib, s['pf_rss'])):>20s}",
               f"{first_pf:>21s}", f"{s['pf_par']:10.2f}", f"{s['pf_cpu']:13.3f}", f"{s['pf_loss']:9.4f}")
    if s["pt_error"] is not None:
        return (f"{pf_cols[0]} {'failed':>7s} {'-':>6s} | {pf_cols[1]} {'-':>16s} | {pf_cols[2]} {'-':>6s} | "
                f"{pf_cols[3]} {'-':>5s} | {pf_cols[4]} {'-':>6s} {'-':>6s} | {pf_cols[5]} {'-':>7s} | "
                f"{'n/a':10s} {'n/a':7s} {'n/a':9s}\n    PyTorch failed: "
                f"{s['pt_error']}")
    loss_pt = "?" if s["pt_loss"] is None else f"{s['pt_loss']:.4f}"
    line = (f"{pf_cols[0]} {s['pt_ms']:7.1f} {s['ratio']:6.2f} | {pf_cols[1]} {'/'.join(map(mib, s['pt_rss'])):>16s} | "
            f"{pf_cols[2]} {s['pt_first']:6.2f} | {pf_cols[3]} {s['pt_par']:5.2f} | {pf_cols[4]} {s['pt_cpu']:6.3f} "
            f"{s['cpu_ratio']:6.2f} | {pf_cols[5]} {loss_pt:>7s} | {GOAL[s['step_ok']]:10s} {GOAL[s['rss_ok']]:7s} "
            f"{GOAL[s['cpu_ok']]:9s}")
    if s.get("pf_gpu") is not None:  # --device cuda: torch.cuda.max_memory_allocated per rank, MiB
        gpu = lambda v: "/".join("?" if x is None else f"{x:.0f}" for x in v)  # noqa: E731
        line += f"\n    max_memory_allocated MiB/rank PF {gpu(s['pf_gpu'])}, PT {gpu(s['pt_gpu'])}: " \
                f"PF<=PT {GOAL[s['gpu_ok']]}"
    return line


# The best rows (issue 28) ---------------------------------------------------

def limit_ms(auto: dict, microbatches: int, ranks: int) -> float:
    """The step time of a zero-bubble, perfectly balanced run of the per-stage
    costs auto measured: every rank busy all step with an equal share of
    M x sum over stages of (F + I + W), B = I + W split as zero-bubble
    schedules split it."""
    return microbatches * sum(c["F"] + c["I"] + c["W"] for c in auto["measured_ms"]) / ranks


def run_best(binary: str, name: str, spec: models.ModelSpec, ranks: int, base: dict, work: str,
             warmup: int) -> dict:
    """Pipeforge's best at `ranks` ranks, then every PyTorch schedule of
    BEST_SCHEDULES, printing one line per run as it ends. Returns the row."""
    layout = f"{ranks}r-best"
    stages = BEST_STAGES_PER_RANK * ranks
    b = {"model": name, "layout": layout, "ranks": ranks, "stages": stages, "pf_error": None, "pt_runs": []}
    pf_job = dict(base, name=f"{name}-{layout}", ranks=ranks, schedule="auto", stages_per_rank=BEST_STAGES_PER_RANK,
                  split_policy={"num_stages": stages, "policy": "cost",
                                "example_inputs": [models.example_input(spec, base["batch"] // base["microbatches"])]})
    pf_job.pop("cuts", None)
    try:
        pf = pipeforge_side.run(binary, pf_job, work)
    except RuntimeError as e:
        b["pf_error"] = torch_error(e)
        print(f"{name:9s} {layout:8s}   Pipeforge best failed: {b['pf_error']}", flush=True)
        return best_summary(b, warmup)
    auto = pf["auto_schedule"] or {}
    b.update(pf_ms=median_ms(pf["step_s"], warmup), pf_cpu=pf["cpu_per_step"], pf_rss=pf["peak_kib"],
             pf_first=pf["first_step_s"], pf_split=pf["split_s"], pf_loss=pf["first_loss"], pf_steps=pf["step_s"],
             cuts=pf["cuts"], cuts_error=pf["cuts_error"], auto_schedule=auto,
             chosen=auto.get("chosen", "?"), chosen_layout=auto.get("layout", "?"),
             simulated_ms=auto.get("simulated_step_ms"), lower_bound_ms=auto.get("lower_bound_ms"),
             limit_ms=limit_ms(auto, base["microbatches"], ranks) if auto.get("measured_ms") else None)
    cuts_text = (", ".join(map(models.cut_label, b["cuts"])) if b["cuts"] is not None
                 else f"not read: {b['cuts_error']}")
    sim = "?" if b["simulated_ms"] is None else f"{b['simulated_ms']:.1f}"
    print(f"{name:9s} {layout:8s}   PF best: cost split, {stages} stages (cuts {cuts_text}); schedule auto -> "
          f"{b['chosen']} ({b['chosen_layout']} layout), simulated {sim} ms; step {b['pf_ms']:.1f} ms, "
          f"CPU {b['pf_cpu']:.3f} s/step, loss@1 {b['pf_loss']:.4f}", flush=True)
    for schedule, per_rank, placement in BEST_SCHEDULES:
        r = {"schedule": schedule, "stages_per_rank": per_rank, "placement": placement, "error": None}
        try:
            # A hand-made split (manual_split.py) cuts at layer boundaries, as torchtitan
            # does: even ones, not the cost split's.
            even = per_rank == 1 or spec.torch_split == "manual"
            cuts = models.cuts(spec, ranks * per_rank) if even else b["cuts"]
        except ValueError as e:
            cuts = None
            r["error"] = f"no {ranks}-stage cuts: {e}"
        if cuts is None and r["error"] is None:
            r["error"] = f"Pipeforge's cuts could not be read: {b['cuts_error']}"
        r["cuts"] = cuts
        if r["error"] is None:
            job = dict(base, name=f"{name}-{layout}-{schedule}", cuts=cuts, ranks=ranks, schedule=schedule,
                       stages_per_rank=per_rank, placement=placement)
            try:
                pt = torch_side.run(job, work)
                r.update(ms=median_ms(pt["step_s"], warmup), cpu=pt["cpu_per_step"], rss=pt["peak_kib"],
                         first=pt["first_step_s"], loss=pt["first_loss"], steps=pt["step_s"])
            except RuntimeError as e:
                r["error"] = torch_error(e)
        b["pt_runs"].append(r)
        print(best_line(b, r), flush=True)
    return best_summary(b, warmup)


def best_summary(b: dict, warmup: int) -> dict:
    """PyTorch's best (the fastest run), the ratios and the goals of a best row."""
    ran = [r for r in b["pt_runs"] if r["error"] is None]
    pt = min(ran, key=lambda r: r["ms"]) if ran else None
    key = (b["model"], b["ranks"])
    b.update(pt_best=pt["schedule"] if pt else None, pt_ms=pt["ms"] if pt else None, pt_cpu=pt["cpu"] if pt else None,
             ratio=None, cpu_ratio=None, pf_limit=None, step_ok=None, cpu_ok=None, limit_ok=None)
    if b["pf_error"] is None:
        if b["limit_ms"] is not None:
            b["pf_limit"] = b["pf_ms"] / b["limit_ms"]
            b["limit_ok"] = b["pf_limit"] <= LIMIT_GOAL if key in LIMIT_GOAL_ROWS else None
        if pt is not None:
            b["ratio"], b["cpu_ratio"] = b["pf_ms"] / pt["ms"], b["pf_cpu"] / pt["cpu"]
            b["step_ok"] = b["ratio"] <= STEP_GOAL if key in BEST_STEP_GOAL_ROWS else None
            b["cpu_ok"] = b["cpu_ratio"] <= CPU_GOAL
    return b


def best_line(b: dict, r: dict) -> str:
    """One PyTorch schedule of a best section."""
    stages = r["stages_per_rank"] * b["ranks"]
    placement = r["placement"] if r["stages_per_rank"] > 1 else "-"  # one stage per rank: stage r
    head = f"{'':9s} {b['layout']:8s}   PT {r['schedule']:21s} {stages} stages, {placement:4s}"
    if r["error"] is not None:
        return f"{head} | failed: {r['error']}"
    loss = "?" if r["loss"] is None else f"{r['loss']:.4f}"
    return (f"{head} | step {r['ms']:8.1f} ms  PF best/this {b['pf_ms'] / r['ms']:5.2f} | CPU {r['cpu']:6.3f} s/step  "
            f"PF best/this {b['pf_cpu'] / r['cpu']:5.2f} | loss@1 {loss}")


BEST_HEADER = (f"{'model':9s} {'layout':8s} | {'step ms PF best':>15s} {'PT best':>7s} {'(schedule)':23s} "
               f"{'PF/PT':>6s} | "
               f"{'limit ms':>8s} {'PF/limit':>8s} | {'CPU s/step PF':>13s} {'PT':>6s} {'PF/PT':>6s} | "
               f"{'step<=0.8x':10s} {'<=1.05 limit':12s} {'CPU<=0.9x':9s}")


def num(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def best_row(b: dict) -> str:
    lead = f"{b['model']:9s} {b['layout']:8s} |"
    if b["pf_error"] is not None:
        return f"{lead} Pipeforge failed: {b['pf_error']}"
    sched = f"({b['pt_best']})" if b["pt_best"] else "(all failed)"
    return (f"{lead} {b['pf_ms']:15.1f} {num(b['pt_ms'], '7.1f'):>7s} {sched:23s} {num(b['ratio'], '6.2f'):>6s} | "
            f"{num(b['limit_ms'], '8.1f'):>8s} {num(b['pf_limit'], '8.2f'):>8s} | {b['pf_cpu']:13.3f} "
            f"{num(b['pt_cpu'], '6.3f'):>6s} {num(b['cpu_ratio'], '6.2f'):>6s} | {GOAL[b['step_ok']]:10s} "
            f"{GOAL[b['limit_ok']]:12s} {GOAL[b['cpu_ok']]:9s}")


def goal_count(rows: list, key: str) -> str:
    judged = [s[key] for s in rows if s.get(key) is not None]
    return f"{sum(judged)}/{len(judged)} rows hold"


def main() -> None:
    a = parse_args()
    binary = os.path.abspath(a.pipeforge)
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    work = a.work or tempfile.mkdtemp(prefix="pipeforge-vs-pytorch-")
    os.makedirs(work, exist_ok=True)
    rows = 4 * a.batch
    pt_adamw, pf_adamw = ADAMW[a.adamw]
    where = ("every rank on GPU 0, NCCL over loopback sockets" if a.device == "cuda" else "Gloo on 127.0.0.1")
    print(f"Pipeforge ({version}) vs torch.distributed.pipelining (torch {torch.__version__}), {where}, "
          f"{os.cpu_count()} cores, {a.precision}")
    print(f"{a.threads} intra-op thread(s) per rank on both sides; batch {a.batch} rows in {a.microbatches} "
          f"microbatches; AdamW '{a.adamw}' on both sides (PyTorch {pt_adamw}, Pipeforge {pf_adamw}); {a.steps} steps, "
          f"median of the last {a.steps - a.warmup}; scratch {work}")
    if a.best_ranks and a.device == "cuda":
        print("best rows: not on a GPU (auto's profile and the limit assume a core per rank); use --no-best")
        a.best_ranks = []
    if a.best_ranks:
        print(f"best rows at {', '.join(map(str, a.best_ranks))} ranks: Pipeforge's cost split into 2P stages + "
              f"schedule auto vs PyTorch's fastest of {', '.join(s for s, _, _ in BEST_SCHEDULES)}; "
              "limit = M x sum over stages (F+I+W) / P of auto's measured costs")
    batch_rows = [interop_common.batch_rows(SEED, rows, s, a.batch) for s in range(a.steps)]
    results, best, pf_failed = [], [], []
    for name in a.models:
        spec = models.MODELS[name]
        model_file = models.make_model_file(spec, os.path.abspath(a.zoo), work, a.precision)
        data = os.path.join(work, name + ".data.pt")
        models.make_data(spec, rows, data)
        base = {"model": name, "model_file": model_file, "data": data, "microbatches": a.microbatches,
                "batch": a.batch, "threads": a.threads, "optimizer": OPTIMIZER, "adamw": a.adamw, "seed": SEED,
                "rows": batch_rows, "warmup": a.warmup, "device": a.device, "precision": a.precision}
        print(f"\n{name}: {spec.describe}")
        if a.layouts:
            print(HEADER, flush=True)
        for layout in a.layouts:
            ranks, schedule, per_rank, *tp = LAYOUTS[layout]
            tp = tp[0] if tp else 1
            if tp > 1 and name not in TP_MODELS:
                continue
            job = dict(base, name=f"{name}-{layout}", cuts=models.cuts(spec, ranks // tp * per_rank), ranks=ranks,
                       schedule=schedule, stages_per_rank=per_rank, placement="v", tensor_parallel=tp)
            try:
                pf = pipeforge_side.run(binary, job, work)
            except RuntimeError as e:  # the row has no Pipeforge side; the others still run
                print(f"{name:9s} {layout:8s} | Pipeforge failed: {torch_error(e)}", flush=True)
                pf_failed.append(f"{name} {layout}: {torch_error(e)}")
                continue
            try:
                pt, error = torch_side.run(job, work), None
            except RuntimeError as e:  # PyTorch cannot pipeline this model: Pipeforge's side still stands
                pt, error = None, torch_error(e)
            s = summarize(name, layout, pf, pt, a.warmup)
            s["pt_error"] = error
            s["cuts"] = job["cuts"]
            results.append(s)
            print(row(s), flush=True)
        model_best = []
        for ranks in a.best_ranks:
            print(f"{name} at {ranks} ranks, each side's best:", flush=True)
            model_best.append(run_best(binary, name, spec, ranks, base, work, a.warmup))
        if model_best:
            print(BEST_HEADER)
            for b in model_best:
                print(best_row(b), flush=True)
        best += model_best

    if results:
        print("\nAll rows:")
        print(HEADER)
        for s in results:
            print(row(s))
    if best:
        print("\nAll best rows:")
        print(BEST_HEADER)
        for b in best:
            print(best_row(b))
    step_rows = [s for s in results if s["step_ok"] is not None]
    compared = [s for s in results if s["pt_error"] is None]
    print()
    gpu_rows = [s for s in results if s.get("gpu_ok") is not None]
    if gpu_rows:
        print(f"Goal max_memory_allocated PF <= PT on every rank: {goal_count(gpu_rows, 'gpu_ok')}")
    if results:
        print(f"Goal step <= {STEP_GOAL}x PyTorch (GPT models and the Llama): "
              f"{sum(s['step_ok'] for s in step_rows)}/{len(step_rows)} rows hold; "
              f"goal peak RSS <= PyTorch on every rank: {sum(s['rss_ok'] for s in compared)}/{len(compared)} rows "
              f"hold; goal CPU s/step <= {CPU_GOAL}x PyTorch: {goal_count(results, 'cpu_ok')}")
    if best:
        print(f"Best rows: goal PF best <= {STEP_GOAL}x PT best (gpt24, 2 and 4 ranks): "
              f"{goal_count(best, 'step_ok')}; goal PF best <= {LIMIT_GOAL}x the limit (gpt24, 2 ranks): "
              f"{goal_count(best, 'limit_ok')}; goal CPU s/step <= {CPU_GOAL}x PT best: {goal_count(best, 'cpu_ok')}")
    if pf_failed:
        print(f"Pipeforge failed {len(pf_failed)} row(s): " + "; ".join(pf_failed))
    failed = [s for s in results if s["pt_error"] is not None]
    if failed:
        print(f"PyTorch could not train {len(failed)} row(s) that Pipeforge trained: "
              + ", ".join(f"{s['model']} {s['layout']}" for s in failed))
    failed_best = [f"{b['model']} {b['layout']} {r['schedule']}" for b in best for r in b["pt_runs"] if r["error"]]
    if failed_best:
        print(f"PyTorch schedules that failed in the best rows: {', '.join(failed_best)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"version": version, "torch": torch.__version__, "args": vars(a), "results": results,
                       "best": best}, f, indent=1)
    if not a.work:
        import shutil
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
