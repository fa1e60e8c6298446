"""`pipeline.schedule: auto` under three memory limits: what it picks, its
simulated against its measured activation peak, and step time.

Trains the zoo's largest GPT (gpt_demo: 4 blocks, 64 wide, vocabulary 256,
64-byte rows) on 2 ranks, 2 stages per rank, 8 microbatches, AdamW, on a text
file, once with `schedule: auto` and no limit, then with pipeline.memory_limit
set to the model state plus 90%, 70% and 50% of the unconstrained choice's
simulated activation peak (never below one microbatch per stage). Per run it
prints the choice, the simulated peak (max over ranks), the measured peak
(max over ranks, metrics.jsonl's activation_memory), their ratio, the
simulated step time and the measured median step time after the first step.

  bash bench/memory_aware_auto.sh                 # 8 steps of batch 32
  bash bench/memory_aware_auto.sh --steps 12 --batch 64

Run it on a quiet machine: a compiler in the background moves the times.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

RANKS, PER_RANK = 2, 2


def run(args, d, name, limit=None):
    limit_line = f"\n  memory_limit: {limit:.0f}B" if limit is not None else ""
    config = os.path.join(d, name + ".yaml")
    with open(config, "w") as f:
        f.write(f"""model: {{path: {os.path.join(args.zoo, 'gpt_demo.pt')}, num_stages: {RANKS * PER_RANK}, policy: parameters}}
pipeline:
  schedule: auto
  microbatches: {args.microbatches}
  stages_per_rank: {PER_RANK}{limit_line}
loss: cross_entropy
optimizer: {{name: adamw, lr: 1.0e-3}}
data: {{format: text, path: {args.text}, block_size: 64}}
training: {{steps: {args.steps}, global_batch_size: {args.batch}, eval_every: 0}}
checkpoint: {{dir: {os.path.join(d, name, 'ckpt')}}}
output: {{dir: {os.path.join(d, name, 'out')}, log_every: 1}}
""")
    r = subprocess.run([args.pipeforge, "train", "--config", config, "--nproc", str(RANKS)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        sys.exit(f"{name}: pipeforge exited {r.returncode}:\n{r.stdout}{r.stderr}")
    with open(os.path.join(d, name, "out", "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    auto = next(r for r in records if r["event"] == "start")["auto_schedule"]
    steps = [r["step_s"] for r in records if r["event"] == "train"][1:]
    measured = max(r["peak_bytes"] for r in records if r["event"] == "activation_memory")
    return auto, measured, statistics.median(steps) if steps else float("nan")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pipeforge", default=os.path.join(here, "..", "build", "cli", "pipeforge"))
    p.add_argument("--zoo", default=os.path.join(here, "..", "build", "zoo"))
    p.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--microbatches", type=int, default=8)
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as d:
        free, measured, step = run(args, d, "free")
        state = free["model_state_bytes"]
        peak = free["simulated_peak_activation_bytes"]
        smallest = 2 * max(c["activation_bytes"] for c in free["measured_ms"])
        rows = [("none", free, measured, step)]
        for share in (0.9, 0.7, 0.5):
            budget = max(share * peak, smallest)
            auto, measured, step = run(args, d, f"limit{share}", state + budget)
            rows.append((f"{state / 2**20:.2f} MiB + {budget / 2**20:.2f} MiB", auto, measured, step))
        print(f"gpt_demo, {RANKS} ranks x {PER_RANK} stages, {args.microbatches} microbatches of "
              f"{args.batch // args.microbatches} rows; model state {state / 2**20:.2f} MiB per rank (largest)")
        print(f"{'memory_limit':>26s}  {'auto chose':34s} {'sim peak':>10s} {'measured':>10s} {'ratio':>6s} "
              f"{'sim step':>9s} {'step':>8s}")
        for label, auto, measured, step in rows:
            sim = auto["simulated_peak_activation_bytes"]
            print(f"{label:>26s}  {auto['chosen'][:34]:34s} {sim / 2**20:8.2f}Mi {measured / 2**20:8.2f}Mi "
                  f"{measured / sim:6.3f} {auto['simulated_step_ms']:7.1f}ms {step * 1e3:6.1f}ms")


if __name__ == "__main__":
    main()
