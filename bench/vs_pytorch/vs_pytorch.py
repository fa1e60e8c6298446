"""Pipeforge against torch.distributed.pipelining, side by side in one run (issue 11).

For every model x layout both sides train the same weights, cut at the same
FQNs, with the same schedule, microbatches, batch rows, AdamW settings, ranks
(Gloo on 127.0.0.1) and intra-op threads per rank; then one table row:

  step ms     median over the steps after warm-up of rank 0's step time
  PF/PT       the ratio of the two medians
  peak RSS    per rank, MiB (VmHWM)
  1st step s  from the start of the processes to the end of step 1, the split
              included (Pipeforge: `pipeforge split` + `pipeforge train` until
              step 1 ends; PyTorch: import, pipeline(), build_stage, step 1)
  CPU par.    CPU seconds of all ranks / wall seconds over the timed steps
  CPU s/step  CPU seconds of all ranks per timed step: the work done, which
              background load on the machine moves much less than wall time
  loss@1      the step-1 loss of each side (same weights and rows: equal up
              to float rounding; a sanity check that both train the same thing)

Goals (issue 11): Pipeforge step <= 0.8x PyTorch's on the GPT models, and
Pipeforge's peak RSS <= PyTorch's on every rank. Each row says whether they hold.
Run through run.sh; `--help` lists the options.
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

# layout name -> (ranks, schedule, stages per rank)
LAYOUTS = {
    "2r-1F1B": (2, "1F1B", 1),
    "2r-ZBV": (2, "ZBVZeroBubble", 2),
    "4r-ZBV": (4, "ZBVZeroBubble", 2),
}
STEP_GOAL_MODELS = ("gpt_demo", "gpt24")
STEP_GOAL = 0.8
SEED = 1337
OPTIMIZER = {"lr": 1.0e-3, "betas": [0.9, 0.95], "eps": 1.0e-8, "weight_decay": 0.01}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pipeforge", default=os.environ.get("PIPEFORGE", "build/cli/pipeforge"))
    p.add_argument("--zoo", default="build/zoo", help="folder with gpt_demo.pt")
    p.add_argument("--models", default=",".join(models.MODELS), help=f"comma list of {', '.join(models.MODELS)}")
    p.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma list of {', '.join(LAYOUTS)}")
    p.add_argument("--steps", type=int, default=15, help="optimizer steps per run, warm-up included")
    p.add_argument("--warmup", type=int, default=4, help="steps left out of the median")
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--batch", type=int, default=32, help="rows per step (global batch)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank, both sides")
    p.add_argument("--quick", action="store_true", help="smoke run: gpt_demo on 2r-1F1B, 6 steps (2 warm-up)")
    p.add_argument("--work", default="", help="scratch folder (default: a new one under /tmp, removed after)")
    p.add_argument("--json", default="", help="also write every measurement to this file")
    a = p.parse_args()
    if a.quick:
        a.models, a.layouts, a.steps, a.warmup = "gpt_demo", "2r-1F1B", 6, 2
    a.models, a.layouts = a.models.split(","), a.layouts.split(",")
    for m in a.models:
        if m not in models.MODELS:
            p.error(f"unknown model '{m}'; known: {', '.join(models.MODELS)}")
    for lay in a.layouts:
        if lay not in LAYOUTS:
            p.error(f"unknown layout '{lay}'; known: {', '.join(LAYOUTS)}")
    if a.steps - a.warmup < 3 or a.warmup < 1:
        p.error(f"--steps {a.steps} --warmup {a.warmup}: need warm-up >= 1 and >= 3 timed steps")
    if a.batch % a.microbatches:
        p.error(f"--batch {a.batch} is not a multiple of --microbatches {a.microbatches}")
    if not os.access(a.pipeforge, os.X_OK):
        p.error(f"no pipeforge binary at {a.pipeforge}; build it or set PIPEFORGE")
    return a


def mib(kib) -> str:
    return "?" if kib is None else f"{kib / 1024:.0f}"


def summarize(model: str, layout: str, pf: dict, pt, warmup: int) -> dict:
    """One row. `pt` is None when the PyTorch side could not train the model
    (its error is kept in the row): only Pipeforge's columns are filled."""
    pf_ms = statistics.median(pf["step_s"][warmup:]) * 1e3
    s = {"model": model, "layout": layout, "pf_ms": pf_ms, "pf_rss": pf["peak_kib"], "pf_first": pf["first_step_s"],
         "pf_split": pf["split_s"], "pf_par": pf["parallelism"], "pf_cpu": pf["cpu_per_step"],
         "pf_loss": pf["first_loss"], "pf_steps": pf["step_s"], "pt_error": None}
    if pt is None:
        return dict(s, pt_ms=None, ratio=None, pt_rss=None, pt_first=None, pt_par=None, pt_cpu=None, pt_loss=None,
                    step_ok=None, rss_ok=None, pt_steps=None)
    pt_ms = statistics.median(pt["step_s"][warmup:]) * 1e3
    ratio = pf_ms / pt_ms
    rss_ok = all(a is not None and b is not None and a <= b for a, b in zip(pf["peak_kib"], pt["peak_kib"]))
    step_ok = ratio <= STEP_GOAL if model in STEP_GOAL_MODELS else None
    return dict(s, pt_ms=pt_ms, ratio=ratio, pt_rss=pt["peak_kib"], pt_first=pt["first_step_s"],
                pt_par=pt["parallelism"], pt_cpu=pt["cpu_per_step"], pt_loss=pt["first_loss"], step_ok=step_ok,
                rss_ok=rss_ok, pt_steps=pt["step_s"])


def torch_error(e: Exception) -> str:
    """The exception line a failed PyTorch rank ended with (its log's last 'Error:' line)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error:" in ln or "Exception:" in ln]
    return (errors or lines or ["(no output)"])[-1]


HEADER = (f"{'model':9s} {'layout':8s} | {'step ms PF':>10s} {'PT':>7s} {'PF/PT':>6s} | {'peak RSS MiB/rank PF':>20s} "
          f"{'PT':>16s} | {'1st step s PF (split)':>21s} {'PT':>6s} | {'CPU par PF':>10s} {'PT':>5s} | "
          f"{'CPU s/step PF':>13s} {'PT':>6s} | "
          f"{'loss@1 PF':>9s} {'PT':>7s} | {'step<=0.8x':10s} {'RSS<=PT':7s}")


def row(s: dict) -> str:
    goal = {True: "yes", False: "NO", None: "n/a"}
    first_pf = f"{s['pf_first']:.2f} ({s['pf_split']:.2f})"
    pf_cols = (f"{s['model']:9s} {s['layout']:8s} | {s['pf_ms']:10.1f}", f"{'/'.join(map(mib, s['pf_rss'])):>20s}",
               f"{first_pf:>21s}", f"{s['pf_par']:10.2f}", f"{s['pf_cpu']:13.3f}", f"{s['pf_loss']:9.4f}")
    if s["pt_error"] is not None:
        return (f"{pf_cols[0]} {'failed':>7s} {'-':>6s} | {pf_cols[1]} {'-':>16s} | {pf_cols[2]} {'-':>6s} | "
                f"{pf_cols[3]} {'-':>5s} | {pf_cols[4]} {'-':>6s} | {pf_cols[5]} {'-':>7s} | "
                f"{'n/a':10s} {'n/a':7s}\n    PyTorch failed: {s['pt_error']}")
    loss_pt = "?" if s["pt_loss"] is None else f"{s['pt_loss']:.4f}"
    return (f"{pf_cols[0]} {s['pt_ms']:7.1f} {s['ratio']:6.2f} | {pf_cols[1]} {'/'.join(map(mib, s['pt_rss'])):>16s} | "
            f"{pf_cols[2]} {s['pt_first']:6.2f} | {pf_cols[3]} {s['pt_par']:5.2f} | {pf_cols[4]} {s['pt_cpu']:6.3f} | "
            f"{pf_cols[5]} {loss_pt:>7s} | {goal[s['step_ok']]:10s} {goal[s['rss_ok']]:7s}")


def main() -> None:
    a = parse_args()
    binary = os.path.abspath(a.pipeforge)
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    work = a.work or tempfile.mkdtemp(prefix="pipeforge-vs-pytorch-")
    os.makedirs(work, exist_ok=True)
    rows = 4 * a.batch
    print(f"Pipeforge ({version}) vs torch.distributed.pipelining (torch {torch.__version__}), Gloo on 127.0.0.1, "
          f"{os.cpu_count()} cores")
    print(f"{a.threads} intra-op thread(s) per rank on both sides; batch {a.batch} rows in {a.microbatches} "
          f"microbatches; AdamW; {a.steps} steps, median of the last {a.steps - a.warmup}; scratch {work}")
    batch_rows = [interop_common.batch_rows(SEED, rows, s, a.batch) for s in range(a.steps)]
    results = []
    for name in a.models:
        spec = models.MODELS[name]
        model_file = models.make_model_file(spec, os.path.abspath(a.zoo), work)
        data = os.path.join(work, name + ".data.pt")
        models.make_data(spec, rows, data)
        print(f"\n{name}: {spec.describe}")
        print(HEADER, flush=True)
        for layout in a.layouts:
            ranks, schedule, per_rank = LAYOUTS[layout]
            job = {"name": f"{name}-{layout}", "model": name, "model_file": model_file, "data": data,
                   "cuts": models.cuts(spec, ranks * per_rank), "ranks": ranks, "schedule": schedule,
                   "stages_per_rank": per_rank, "microbatches": a.microbatches, "batch": a.batch,
                   "threads": a.threads, "optimizer": OPTIMIZER, "seed": SEED, "rows": batch_rows,
                   "warmup": a.warmup}
            pf = pipeforge_side.run(binary, job, work)
            try:
                pt, error = torch_side.run(job, work), None
            except RuntimeError as e:  # PyTorch cannot pipeline this model: Pipeforge's side still stands
                pt, error = None, torch_error(e)
            s = summarize(name, layout, pf, pt, a.warmup)
            s["pt_error"] = error
            s["cuts"] = job["cuts"]
            results.append(s)
            print(row(s), flush=True)

    print("\nAll rows:")
    print(HEADER)
    for s in results:
        print(row(s))
    step_rows = [s for s in results if s["step_ok"] is not None]
    compared = [s for s in results if s["pt_error"] is None]
    print(f"\nGoal step <= {STEP_GOAL}x PyTorch (GPT models): "
          f"{sum(s['step_ok'] for s in step_rows)}/{len(step_rows)} rows hold; "
          f"goal peak RSS <= PyTorch on every rank: {sum(s['rss_ok'] for s in compared)}/{len(compared)} rows hold")
    failed = [s for s in results if s["pt_error"] is not None]
    if failed:
        print(f"PyTorch could not train {len(failed)} row(s) that Pipeforge trained: "
              + ", ".join(f"{s['model']} {s['layout']}" for s in failed))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"version": version, "torch": torch.__version__, "args": vars(a), "results": results}, f, indent=1)
    if not a.work:
        import shutil
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
