"""ZeRO stages side by side: `pipeline.zero_stage` 0 to 3 at pipeline 2 x
data parallel 2 on 4 Gloo ranks (issue 42).

Trains a GPT-2 (transformers, random init, exported with torch.export) with
fp32 AdamW, once per zero stage, and prints per run: each rank's peak RSS
(VmHWM polled from /proc), the model state each rank keeps between steps
(metrics.jsonl's `model_state`, bytes per parameter against the formula:
16 for zero 0, 8 + 8/d for zero 1, 4 + 12/d for zero 2, 16/d for zero 3,
whose working copy of the unsharded stages exists only inside a step and
shows in the peak RSS), and the median step time after the first step,
relative to zero 0 (goals: zero 1 <= 1.05x, zero 3 <= 1.25x).

  bash bench/zero_bench.sh                    # GPT-2 124M (12 blocks, d=768), 4 steps
  bash bench/zero_bench.sh --model 355m --steps 3

Run it on a quiet machine: a compiler in the background moves the times.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "vs_pytorch"))
sys.path.insert(0, HERE)
import procstat  # noqa: E402
from streaming_split import export_gpt2  # noqa: E402

MODELS = {"124m": (12, 768), "355m": (24, 1024)}
DP = 2
MB = 1e6


def run(args, model, data, d, zero):
    run_dir = os.path.join(d, f"zero{zero}")
    config = run_dir + ".yaml"
    with open(config, "w") as f:
        f.write(f"""model: {{path: {model}, num_stages: 2, policy: parameters}}
pipeline: {{schedule: 1F1B, microbatches: 4, data_parallel: {DP}, zero_stage: {zero}}}
loss: cross_entropy
optimizer: {{name: adamw, lr: 1.0e-4}}
data: {{format: tensors, path: {data}, val_fraction: 0.0}}
training: {{steps: {args.steps}, global_batch_size: {4 * DP}, eval_every: 0}}
output: {{dir: {run_dir}/out, log_every: 1}}
""")
    proc = subprocess.Popen([args.pipeforge, "train", "--config", config, "--nproc", str(2 * DP)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    with procstat.RankWatcher(lambda: procstat.rank_pids(proc.pid), lambda now, w: None) as watcher:
        _, status, _ = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"zero {zero}: pipeforge exited {os.waitstatus_to_exitcode(status)}:\n{err[-3000:]}")
    with open(os.path.join(run_dir, "out", "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    steps = [r["step_s"] for r in records if r["event"] == "train"][1:]
    states = sorted((r for r in records if r["event"] == "model_state"), key=lambda r: r["rank"])
    return {"step_s": statistics.median(steps), "rss": [watcher.peak_kib.get(r, 0) * 1024 for r in range(2 * DP)],
            "states": states}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeforge", default="build/cli/pipeforge")
    parser.add_argument("--work", default="build/bench-zoo")
    parser.add_argument("--model", default="124m", choices=sorted(MODELS))
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    layers, width = MODELS[args.model]
    model = os.path.join(args.work, f"gpt2_{args.model}.pt2")
    if not os.path.exists(model):
        print(f"exporting GPT-2 {args.model} ({layers} blocks, d={width}) to {model} ...", flush=True)
        export_gpt2(model, layers, width)
    import torch
    with tempfile.TemporaryDirectory(prefix="pf-zero-bench-") as d:
        data = os.path.join(d, "data.pt")
        tokens = torch.randint(0, 50257, (256, 65), generator=torch.Generator().manual_seed(0))
        torch.save({"inputs": tokens[:, :-1].contiguous(), "targets": tokens[:, 1:].contiguous()}, data)
        results = {z: run(args, model, data, d, z) for z in (0, 1, 2, 3)}
    base = results[0]["step_s"]
    print(f"\n## GPT-2 {args.model}, pp 2 x dp {DP} on 4 ranks, fp32 AdamW, {args.steps} steps")
    print("| zero stage | step s | vs zero 0 | peak RSS MB per rank | bytes/param per rank | formula | goal |")
    print("| --- | ---: | ---: | --- | --- | ---: | --- |")
    for z, r in results.items():
        formula = {0: 16.0, 1: 8.0 + 8.0 / DP, 2: 4.0 + 12.0 / DP, 3: 16.0 / DP}[z]
        per_param = [s["bytes_per_parameter"] for s in r["states"]]
        ratio = r["step_s"] / base
        limit = {1: 1.05, 3: 1.25}.get(z)
        goal = f"<= {limit}x: {'held' if ratio <= limit else 'MISSED'}" if limit else "-"
        print(f"| {z} | {r['step_s']:.3f} | {ratio:.3f} | {', '.join(f'{b / MB:.0f}' for b in r['rss'])} | "
              f"{', '.join(f'{b:.2f}' for b in per_param)} | {formula:.1f} | {goal} |")


if __name__ == "__main__":
    main()
