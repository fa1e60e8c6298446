"""Activation checkpointing: peak memory and step time, none vs full vs every_n, side by side.

Trains bench/vs_pytorch's 24-block GPT (d=256, 8 heads, T=64, tied head) with
`pipeforge train --nproc 2`, 1F1B, the same batch, data, cut and AdamW steps
once per `pipeline.activation_checkpointing` value, one after the other in
this run, and prints per mode the median step time (rank 0's `step_s` after
the warm-up steps), the CPU seconds per step of all ranks, and each rank's
peak RSS (VmHWM polled from /proc, as bench/vs_pytorch does), then the ratios
to none of full and of {every_n: 2} (each stage recomputes its 2nd, 4th, ...
block). The first-step losses
are printed too: equal, since checkpointing changes no value.

  bash bench/activation_checkpointing.sh                      # batch 32 in 8 microbatches, 8 steps
  bash bench/activation_checkpointing.sh --batch 64 --steps 6

Run it on a quiet machine: a compiler in the background moves every number.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "vs_pytorch"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "interop"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "models"))
sys.dont_write_bytecode = True

import interop_common  # noqa: E402
import models  # noqa: E402
import pipeforge_side  # noqa: E402

MODES = ["none", "full", "{every_n: 2}"]
OPTIMIZER = {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}
SEED = 1234


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pipeforge", default="build/cli/pipeforge")
    p.add_argument("--model", default="gpt24", choices=sorted(models.MODELS))
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--schedule", default="1F1B")
    p.add_argument("--batch", type=int, default=32, help="rows per step")
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the median")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    p.add_argument("--zoo", default="build/zoo")
    p.add_argument("--work", default="", help="scratch folder (default: a temporary one, removed)")
    a = p.parse_args()
    if a.steps < a.warmup + 2:
        raise SystemExit("--steps must be at least --warmup + 2")

    binary = os.path.abspath(a.pipeforge)
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    work = a.work or tempfile.mkdtemp(prefix="pipeforge-ckpt-bench-")
    os.makedirs(work, exist_ok=True)
    spec = models.MODELS[a.model]
    model_file = models.make_model_file(spec, os.path.abspath(a.zoo), work)
    rows = 4 * a.batch
    data = os.path.join(work, a.model + ".data.pt")
    models.make_data(spec, rows, data)
    print(f"Pipeforge ({version}): activation checkpointing on {spec.describe}")
    print(f"{a.ranks} ranks, {a.schedule}, batch {a.batch} rows in {a.microbatches} microbatches, AdamW, "
          f"{a.threads} intra-op thread(s) per rank, {os.cpu_count()} cores; {a.steps} steps, median of the last "
          f"{a.steps - a.warmup}; scratch {work}", flush=True)

    results = {}
    for mode in MODES:
        label = "".join(c for c in mode if c.isalnum() or c == "_")
        job = {"name": f"{a.model}-{a.ranks}r-{a.schedule}-{label}", "model": a.model, "model_file": model_file,
               "data": data, "cuts": models.cuts(spec, a.ranks), "ranks": a.ranks, "schedule": a.schedule,
               "stages_per_rank": 1, "microbatches": a.microbatches, "batch": a.batch, "threads": a.threads,
               "optimizer": OPTIMIZER, "seed": SEED,
               "rows": [interop_common.batch_rows(SEED, rows, s, a.batch) for s in range(a.steps)],
               "warmup": a.warmup, "activation_checkpointing": mode}
        r = pipeforge_side.run(binary, job, work)
        r["median_ms"] = statistics.median(r["step_s"][a.warmup:]) * 1e3
        results[mode] = r
        rss = "  ".join(f"rank {i} {kib / 1024:8.1f} MiB" for i, kib in enumerate(r["peak_kib"]))
        steps = ", ".join(f"{t * 1e3:.0f}" for t in r["step_s"])
        print(f"{mode:12s}  step {r['median_ms']:8.1f} ms  CPU {r['cpu_per_step']:6.2f} s/step  peak RSS {rss}  "
              f"step-1 loss {r['first_loss']:.6f}  (every step, ms: {steps})", flush=True)

    base = results["none"]
    for mode in MODES[1:]:
        ckpt = results[mode]
        print(f"\n{mode} / none:")
        print(f"  step time  {ckpt['median_ms'] / base['median_ms']:.3f}")
        print(f"  CPU s/step {ckpt['cpu_per_step'] / base['cpu_per_step']:.3f}  (all ranks' CPU time: the work done, "
              "which background load moves much less than wall time)")
        for i, (b, c) in enumerate(zip(base["peak_kib"], ckpt["peak_kib"])):
            print(f"  peak RSS rank {i}  {c / b:.3f}  ({(b - c) / 1024:+.1f} MiB saved)")
        if abs(base["first_loss"] - ckpt["first_loss"]) > 1e-5:
            print(f"WARNING: step-1 losses differ ({mode}): {base['first_loss']} vs {ckpt['first_loss']}")
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
