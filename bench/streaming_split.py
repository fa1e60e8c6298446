"""Splitting and starting big models (issue 25): peak RSS and wall time, side by side in one run.

1. Split. transformers GPT-2 with 24 blocks, d=1024 (355 M parameters) and
   d=2048 (1.3 B), random init, exported with torch.export.save. Each side is
   a whole process, its peak RSS from wait4's ru_maxrss:
     - `pipeforge split MODEL --spec {num_stages: 4, policy: parameters}`;
     - `python -c "torch.export.load(MODEL).module()"` (import torch included).
   The models are exported with return_dict=False (a tuple out), which
   torch.export.load reads without transformers' output classes.
   Goals: split peak RSS <= 0.25 x the file + 300 MB; split wall <= 0.5 x load.
2. Start-up. `pipeforge train --nproc 4` of the 1.3 B split (4 stages on 4
   ranks, 1F1B, SGD, one row of 64 tokens per microbatch) for one step: the
   time from launch to the ranks' start (the metrics' start record) and to
   step 1's record, the launcher's peak RSS (its checks before any rank
   starts) and each rank's (VmHWM polled from /proc), next to each rank's
   share of the file.

3. The disk's speed (issue 41): each split next to `cp` of the same bytes on
   the same disk (the physical limit), warm page cache on both sides:
     - `pipeforge split MODEL.pt2` of the weight-bearing export against `cp MODEL.pt2`;
     - `pipeforge split META.pt2 --weights SRC --weights BUFFERS` of the same
       model exported on the meta device (pipeforge.export_on_meta), its
       weights a save_pretrained folder (SRC, safetensors), against `cp -r SRC`;
     - the same from a bf16 save_pretrained folder: every tensor converted to
       the export's fp32 as it is written (twice SRC's bytes out), so its
       row shows the peak RSS holding while converting.
   Both sides write synced files (the split fsyncs its folder); each is the
   better of two runs, interleaved. Goals: each split <= 1.5 x its copy.

Models are exported once into --work. Usage: bash bench/streaming_split.sh [--models 355m,1300m] [--no-startup]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "vs_pytorch"))
import procstat  # noqa: E402

MODELS = {"355m": (24, 1024), "1300m": (24, 2048)}
MB = 1e6


def export_gpt2(path: str, layers: int, width: int) -> None:
    code = f"""
import os, torch, transformers
torch.manual_seed(0)
cfg = transformers.GPT2Config(n_layer={layers}, n_embd={width}, n_head=16, n_positions=1024, vocab_size=50257,
                              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
model = transformers.GPT2LMHeadModel(cfg).eval()
ep = torch.export.export(model, (torch.randint(0, 50257, (1, 64)),), kwargs={{"use_cache": False, "return_dict": False}})
tmp = os.path.join(os.path.dirname({path!r}), ".tmp")
os.makedirs(tmp, exist_ok=True)
torch.export.save(ep, os.path.join(tmp, os.path.basename({path!r})))
os.replace(os.path.join(tmp, os.path.basename({path!r})), {path!r})
"""
    subprocess.run([sys.executable, "-W", "ignore", "-c", code], check=True)


def export_gpt2_meta(meta_path: str, pretrained: str, layers: int, width: int) -> None:
    """The same GPT-2 exported on the meta device, and its weights as a save_pretrained folder."""
    code = f"""
import os, sys, torch, transformers
sys.path.insert(0, {os.path.join(HERE, "..", "python")!r})
from pipeforge import export_on_meta
torch.manual_seed(0)
cfg = transformers.GPT2Config(n_layer={layers}, n_embd={width}, n_head=16, n_positions=1024, vocab_size=50257,
                              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
model = transformers.GPT2LMHeadModel(cfg)
model.save_pretrained({pretrained!r}, max_shard_size="2GB")
model.to(torch.bfloat16).save_pretrained({pretrained!r} + "_bf16", max_shard_size="2GB")
del model
export_on_meta(lambda: transformers.GPT2LMHeadModel(cfg).eval(), (torch.randint(0, 50257, (1, 64)),),
               kwargs={{"use_cache": False, "return_dict": False}}, path={meta_path!r})
"""
    subprocess.run([sys.executable, "-W", "ignore", "-c", code], check=True)


def folder_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def copy_seconds(path: str, work: str) -> float:
    """`cp` of `path` (a file or a folder) to a fresh name on the same disk, synced, like a split's writes."""
    target = os.path.join(work, ".copy")

    def remove() -> None:
        if os.path.isdir(target):
            shutil.rmtree(target)
        elif os.path.exists(target):
            os.remove(target)

    remove()
    subprocess.run(["sync", "-f", work], check=False)
    t0 = time.monotonic()
    subprocess.run(["cp", "-r", path, target], check=True)
    subprocess.run(["sync", "-f", target], check=False)
    seconds = time.monotonic() - t0
    remove()
    return seconds


def bench_disk(binary: str, name: str, model: str, work: str) -> list:
    """Rows (kind, bytes, split s, cp s, RSS) of issue 41's disk-speed goal."""
    layers, width = MODELS[name]
    spec = os.path.join(work, "split4.yaml")
    meta = os.path.join(work, f"gpt2_{name}_meta.pt2")
    pretrained = os.path.join(work, f"gpt2_{name}_pretrained")
    if not os.path.exists(meta) or not os.path.isdir(pretrained) or not os.path.isdir(pretrained + "_bf16"):
        print(f"exporting GPT-2 {name} on the meta device, weights to {pretrained} ...", flush=True)
        export_gpt2_meta(meta, pretrained, layers, width)
    buffers = meta[:-4] + ".buffers.safetensors"
    rows = []
    for kind, cmd, source in (
            ("weight-bearing .pt2", [binary, "split", model, "--spec", spec, "--out", model[:-4] + ".disk", "--force"],
             model),
            ("meta .pt2 + safetensors", [binary, "split", meta, "--weights", pretrained, "--weights", buffers,
                                         "--spec", spec, "--out", meta[:-4] + ".disk", "--force"], pretrained),
            # A bf16 checkpoint of the fp32 export: each tensor converted as it is written (2x the bytes out).
            ("meta .pt2 + bf16 safetensors", [binary, "split", meta, "--weights", pretrained + "_bf16", "--weights",
                                              buffers, "--spec", spec, "--out", meta[:-4] + ".disk", "--force"],
             pretrained + "_bf16")):
        out = cmd[cmd.index("--out") + 1]

        def split_once() -> tuple:
            # As cp's target, the previous output is removed first, untimed
            # (--force would otherwise time deleting it).
            shutil.rmtree(out, ignore_errors=True)
            subprocess.run(["sync", "-f", work], check=False)
            return measured(cmd)

        copy_seconds(source, work)  # warm the page cache for both sides
        split_s, split_rss = split_once()
        cp_s = copy_seconds(source, work)
        split_s2, split_rss2 = split_once()
        cp_s2 = copy_seconds(source, work)
        rows.append((kind, folder_bytes(source), min(split_s, split_s2), min(cp_s, cp_s2), max(split_rss, split_rss2)))
    return rows


def measured(cmd: list, env: dict = None) -> tuple:
    """(wall s, peak RSS bytes) of one whole process."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{err[-3000:]}")
    return wall, usage.ru_maxrss * 1024


def bench_split(binary: str, model: str, work: str) -> dict:
    size = os.path.getsize(model)
    spec = os.path.join(work, "split4.yaml")
    with open(spec, "w") as f:
        f.write("num_stages: 4\npolicy: parameters\n")
    out = os.path.splitext(model)[0] + ".stages"
    # Both sides start from a warm page cache (the file read once, untimed),
    # and the split's previous output is removed first, untimed.
    subprocess.run(["cat", model], stdout=subprocess.DEVNULL, check=True)
    shutil.rmtree(out, ignore_errors=True)
    split_s, split_rss = measured([binary, "split", model, "--spec", spec, "--out", out, "--force"])
    load_s, load_rss = measured([sys.executable, "-W", "ignore", "-c",
                                 "import sys, torch; torch.export.load(sys.argv[1]).module()", model])
    return {"size": size, "split_s": split_s, "split_rss": split_rss, "load_s": load_s, "load_rss": load_rss,
            "stages": out}


def bench_startup(binary: str, stages: str, work: str, ranks: int = 4) -> dict:
    import torch
    data = os.path.join(work, "startup_tokens.pt")
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 50257, (8, 65), generator=g)
    torch.save({"inputs": tokens[:, :-1].contiguous(), "targets": tokens[:, 1:].contiguous()}, data)
    run = tempfile.mkdtemp(prefix="pf-startup-", dir=work)
    config = os.path.join(run, "train.yaml")
    with open(config, "w") as f:
        f.write(f"""model: {{split_dir: {stages}}}
pipeline: {{schedule: 1F1B, microbatches: 4}}
loss: cross_entropy
optimizer: {{name: sgd, lr: 1.0e-4}}
data: {{format: tensors, path: {data}, val_fraction: 0.0}}
training: {{steps: 1, global_batch_size: 4, seed: 0, eval_every: 0}}
distributed: {{timeout_s: 600}}
output: {{dir: {run}/out, log_every: 1}}
""")
    metrics = os.path.join(run, "out", "metrics.jsonl")
    seen = {}

    def tail(now: float, _watcher) -> None:
        try:
            with open(metrics) as f:
                for line in f:
                    if line.strip():
                        seen.setdefault(json.loads(line).get("event"), now)
        except (OSError, ValueError):
            pass

    t0 = time.monotonic()
    proc = subprocess.Popen([binary, "train", "--config", config, "--nproc", str(ranks)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=dict(os.environ, OMP_NUM_THREADS="1"))

    def find_ranks() -> dict:
        # The ranks, and the launcher itself as -1 (wait4's ru_maxrss would include its ranks).
        return {-1: proc.pid, **procstat.rank_pids(proc.pid)}

    with procstat.RankWatcher(find_ranks, tail) as watcher:
        _, status, _ = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"pipeforge train exited {os.waitstatus_to_exitcode(status)}:\n{err[-3000:]}")
    tail(time.monotonic(), watcher)
    stage_bytes = [os.path.getsize(os.path.join(stages, f)) for f in sorted(os.listdir(stages))
                   if f.startswith("stage_")]
    shutil.rmtree(run, ignore_errors=True)
    return {"start_s": seen.get("start", float("nan")) - t0, "step1_s": seen.get("train", float("nan")) - t0,
            "launcher_rss": watcher.peak_kib.get(-1, 0) * 1024, "rank_rss": [watcher.peak_kib.get(r, 0) * 1024 for r in range(ranks)],
            "stage_bytes": stage_bytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeforge", default="build/cli/pipeforge")
    parser.add_argument("--work", default="build/bench-zoo")
    parser.add_argument("--models", default="355m,1300m")
    parser.add_argument("--no-startup", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)

    results = {}
    for name in args.models.split(","):
        layers, width = MODELS[name]
        model = os.path.join(args.work, f"gpt2_{name}.pt2")
        if not os.path.exists(model):
            print(f"exporting GPT-2 {name} ({layers} blocks, d={width}) to {model} ...", flush=True)
            export_gpt2(model, layers, width)
        results[name] = bench_split(args.pipeforge, model, args.work)

    print("\n## pipeforge split (4 stages, policy: parameters) vs torch.export.load(path).module(), whole processes")
    print("| model | file MB | split s | load s | split/load (goal <= 0.5) | split peak RSS MB | load peak RSS MB | "
          "split RSS / file | RSS goal MB (0.25 x file + 300) | goals |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, r in results.items():
        rss_goal = 0.25 * r["size"] + 300 * MB
        ok = r["split_s"] <= 0.5 * r["load_s"] and r["split_rss"] <= rss_goal
        print(f"| {name} | {r['size'] / MB:.0f} | {r['split_s']:.2f} | {r['load_s']:.2f} | "
              f"{r['split_s'] / r['load_s']:.3f} | {r['split_rss'] / MB:.0f} | {r['load_rss'] / MB:.0f} | "
              f"{r['split_rss'] / r['size']:.3f} | {rss_goal / MB:.0f} | {'held' if ok else 'MISSED'} |")

    print("\n## pipeforge split at the disk's speed (issue 41): against `cp` of the same bytes, warm cache, "
          "the better of 2 runs on each side")
    print("| model | kind | source MB | split s | cp s | split / cp (goal <= 1.5) | split peak RSS MB | "
          "RSS goal MB (0.25 x source + 300) | goals |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for name in args.models.split(","):
        model = os.path.join(args.work, f"gpt2_{name}.pt2")
        for kind, size, split_s, cp_s, rss in bench_disk(args.pipeforge, name, model, args.work):
            rss_goal = 0.25 * size + 300 * MB
            # A bf16 source is written as fp32 (twice its bytes): its row's goal is the RSS alone.
            converts = "bf16" in kind
            ok = (converts or split_s <= 1.5 * cp_s) and rss <= rss_goal
            verdict = ("held" if ok else "MISSED") + (" (RSS only: writes 2x the source)" if converts else "")
            print(f"| {name} | {kind} | {size / MB:.0f} | {split_s:.2f} | {cp_s:.2f} | {split_s / cp_s:.2f} | "
                  f"{rss / MB:.0f} | {rss_goal / MB:.0f} | {verdict} |", flush=True)

    if not args.no_startup:
        name = args.models.split(",")[-1]
        s = bench_startup(args.pipeforge, results[name]["stages"], args.work)
        print(f"\n## pipeforge train --nproc 4 of the {name} split (4 stages on 4 ranks), one step")
        print(f"launch -> ranks started: {s['start_s']:.2f} s; launch -> step 1 done: {s['step1_s']:.2f} s")
        print(f"launcher peak RSS: {s['launcher_rss'] / MB:.0f} MB (checks every stage file before any rank starts)")
        for r, (rss, own) in enumerate(zip(s["rank_rss"], s["stage_bytes"])):
            print(f"rank {r}: peak RSS {rss / MB:.0f} MB; its stage file {own / MB:.0f} MB "
                  f"(weights + gradients need ~2x: {rss / own:.2f}x)")


if __name__ == "__main__":
    main()
