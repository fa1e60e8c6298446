"""Step time of `training.precision: bf16` against fp32 on the 24-block GPT of
bench/vs_pytorch (d=256, 8 heads, T=64, tied head), 2 ranks, 1F1B, in one run.

Both precisions train the same split, data and optimizer (batch 32 rows in 8
microbatches, AdamW, 1 intra-op thread per rank, Gloo on 127.0.0.1). The runs
alternate (fp32, bf16, fp32, bf16, ...) so background load hits both alike;
each run's step time is the median of rank 0's `step_s` in metrics.jsonl over
the steps after --warmup, and each precision's figure is the median over its
runs. On a CPU without native bfloat16 matmuls (no AVX512-BF16 / AMX) bf16 is
expected to be slower: autocast adds casts and the bfloat16 kernels emulate.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "vs_pytorch"))


def cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return "?"
    have = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16") if f in flags]
    return ", ".join(have) or "none of avx2/avx512/amx"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pipeforge", default="build/cli/pipeforge")
    p.add_argument("--steps", type=int, default=8, help="steps per run")
    p.add_argument("--warmup", type=int, default=2, help="first steps of each run left out of the median")
    p.add_argument("--repeats", type=int, default=2, help="runs per precision, alternating")
    p.add_argument("--precisions", default="fp32,bf16", help="the first is the baseline of the ratio")
    args = p.parse_args()

    import torch
    import models  # bench/vs_pytorch/models.py: the same GPT24, cuts and data as vs_pytorch

    torch.set_num_threads(1)
    spec = models.MODELS["gpt24"]
    precisions = args.precisions.split(",")
    batch, microbatches = 32, 8
    with tempfile.TemporaryDirectory(prefix="pf-precision-bench-") as work:
        model_file = models.make_model_file(spec, "", work)
        data = os.path.join(work, "data.pt")
        models.make_data(spec, 4 * batch, data)
        split_dir = os.path.join(work, "stages")
        with open(os.path.join(work, "spec.yaml"), "w") as f:
            f.write("split_points:\n" + "".join(f"  {fqn}: BEGINNING\n" for fqn in models.cuts(spec, 2)))
        subprocess.run([args.pipeforge, "split", model_file, "--spec", os.path.join(work, "spec.yaml"), "--out",
                        split_dir], check=True, capture_output=True)
        times = {p: [] for p in precisions}
        first_loss = {}
        for rep in range(args.repeats):
            for precision in precisions:
                run = os.path.join(work, f"{precision}-{rep}")
                config = run + ".yaml"
                with open(config, "w") as f:
                    f.write(f"""model: {{split_dir: {split_dir}}}
pipeline: {{schedule: 1F1B, microbatches: {microbatches}}}
loss: cross_entropy
optimizer: {{name: adamw, lr: 0.001, betas: [0.9, 0.95], weight_decay: 0.01}}
lr_schedule: {{decay: constant, warmup_steps: 0}}
data: {{format: tensors, path: {data}, val_fraction: 0.0}}
training: {{steps: {args.steps}, global_batch_size: {batch}, seed: 7, precision: {precision}}}
distributed: {{timeout_s: 300}}
output: {{dir: {run}, log_every: 1}}
""")
                r = subprocess.run([args.pipeforge, "train", "--config", config, "--nproc", "2"], capture_output=True,
                                   text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
                if r.returncode != 0:
                    raise SystemExit(f"pipeforge train ({precision}) exited {r.returncode}:\n{r.stdout}{r.stderr}")
                with open(os.path.join(run, "metrics.jsonl")) as f:
                    records = [json.loads(line) for line in f]
                train = sorted((x for x in records if x["event"] == "train"), key=lambda x: x["step"])
                first_loss.setdefault(precision, train[0]["loss"])
                step_s = statistics.median(x["step_s"] for x in train[args.warmup:])
                times[precision].append(step_s)
                print(f"  run {rep + 1} {precision}: median step {step_s * 1000:.0f} ms", flush=True)
    base = precisions[0]
    print(f"\n{spec.describe}; 2 ranks, 1F1B, {microbatches} microbatches of {batch // microbatches} rows, AdamW; "
          f"torch {torch.__version__}, {platform.machine()} CPU flags: {cpu_flags()}")
    print(f"{'precision':10s} {'step ms':>9s} {'vs ' + base:>9s} {'step-1 loss':>12s}   runs (ms)")
    for precision in precisions:
        med = statistics.median(times[precision])
        ratio = med / statistics.median(times[base])
        runs = ", ".join(f"{t * 1000:.0f}" for t in times[precision])
        print(f"{precision:10s} {med * 1000:9.0f} {ratio:9.2f} {first_loss[precision]:12.4f}   {runs}")


if __name__ == "__main__":
    main()
