#!/usr/bin/python3
"""Activation memory, measured and simulated, and `schedule: auto` under
`pipeline.memory_limit` (issue 43, item 1).

The zoo's largest GPT (gpt_demo: 4 blocks, 64 wide, vocabulary 256, 64-byte
rows), trained 2 steps with AdamW on 2 Gloo ranks, 8 microbatches of 4 rows:
  * `schedule: auto` with 1 and with 2 stages per rank measures each stage's
    activation memory in its profiling steps, and records every named
    schedule's simulated peak (bytes) in metrics.jsonl's start event;
  * 1F1B (1 stage per rank), ZBVZeroBubble and DualPipeV (2 per rank) then
    train, and each rank's measured peak (the `activation_memory` records) is
    within 10% of the peak auto simulated for that schedule on that rank;
    so is auto's own choice;
  * a limit below one microbatch per stage is refused before training (exit
    1), naming the smallest peak, the least limit and the fixes;
  * a limit 3% above that least one makes auto choose a program whose
    simulated peak fits with auto's 10% headroom (another than the
    unconstrained choice when that one does not fit), and the measured peak
    stays within what the limit leaves.

Usage: test_memory_aware_auto.py PIPEFORGE_BINARY ZOO_DIR
"""
import json
import os
import re
import subprocess
import sys
import tempfile

RANKS = 2
MICROBATCHES = 8
TOLERANCE = 0.10

TEXT = "".join(f"Row {i}: pipelines keep activations alive until the backward frees them.\n"
               for i in range(200)).encode()


def config_text(d, name, model, text, per_rank, schedule, limit=None):
    limit_line = f"\n  memory_limit: {limit:.0f}B" if limit is not None else ""
    return f"""model: {{path: {model}, num_stages: {RANKS * per_rank}, policy: parameters}}
pipeline:
  schedule: {schedule}
  microbatches: {MICROBATCHES}
  stages_per_rank: {per_rank}{limit_line}
loss: cross_entropy
optimizer: {{name: adamw, lr: 1.0e-3}}
data: {{format: text, path: {text}, block_size: 64}}
training: {{steps: 2, global_batch_size: 32, eval_every: 0}}
checkpoint: {{dir: {os.path.join(d, name, 'ckpt')}}}
distributed: {{timeout_s: 120}}
output: {{dir: {os.path.join(d, name, 'out')}}}
"""


def train(binary, d, name, *args, expect=0):
    path = os.path.join(d, name + ".yaml")
    with open(path, "w") as f:
        f.write(config_text(d, name, *args))
    r = subprocess.run([binary, "train", "--config", path, "--nproc", str(RANKS)], capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    out = r.stdout + r.stderr
    if r.returncode != expect:
        raise AssertionError(f"{name}: exit {r.returncode}, expected {expect}:\n{out}")
    if expect != 0:
        return {"output": out}
    with open(os.path.join(d, name, "out", "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    start = next(r for r in records if r["event"] == "start")
    memory = sorted((r for r in records if r["event"] == "activation_memory"), key=lambda r: r["rank"])
    state = [r["param_bytes"] + r["grad_bytes"] + r["optimizer_bytes"] for r in records if r["event"] == "model_state"]
    return {"output": out, "start": start, "memory": memory, "model_state": state}


def named_peak(auto, name):
    for n in auto["start"]["auto_schedule"]["named"]:
        if n["name"] == name:
            return n["simulated_peak_activation_bytes"]
    raise AssertionError(f"auto lists no {name}")


def main():
    binary, zoo = sys.argv[1], sys.argv[2]
    model = os.path.join(zoo, "gpt_demo.pt")
    failures = []

    def within(label, measured, simulated):
        ratio = measured / simulated if simulated else float("inf")
        ok = abs(ratio - 1.0) <= TOLERANCE
        print(f"  {label:34s} measured {measured / 1e6:8.3f} MB  simulated {simulated / 1e6:8.3f} MB  "
              f"ratio {ratio:.3f}: {'ok' if ok else 'OFF'}")
        if not ok:
            failures.append(f"{label}: measured {measured} vs simulated {simulated} (ratio {ratio:.3f})")

    with tempfile.TemporaryDirectory() as d:
        text = os.path.join(d, "text.txt")
        with open(text, "wb") as f:
            f.write(TEXT)
        autos = {}
        for per_rank, names in ((1, ["1F1B"]), (2, ["ZBVZeroBubble", "DualPipeV"])):
            auto = train(binary, d, f"auto{per_rank}", model, text, per_rank, "auto")
            autos[per_rank] = auto
            record = auto["start"]["auto_schedule"]
            sim = record["simulated_rank_peak_activation_bytes"]
            if [m["pipeline_rank"] for m in auto["memory"]] != list(range(RANKS)):
                failures.append(f"auto{per_rank}: activation_memory records {auto['memory']}")
                continue
            print(f"auto, {per_rank} stage(s) per rank, chose {record['chosen']}; per stage kept "
                  f"{[round(c['activation_bytes']) for c in record['measured_ms']]} bytes")
            # The model state auto took off the limit is the chosen layout's
            # largest rank's, as the ranks measure it after their first step.
            if len(auto["model_state"]) != RANKS or record["model_state_bytes"] != max(auto["model_state"]):
                failures.append(f"auto{per_rank}: model state {record['model_state_bytes']} for the "
                                f"{record.get('layout')} layout, measured {auto['model_state']}")
            for m in auto["memory"]:
                within(f"auto{per_rank} ({record['chosen'][:16]}) rank {m['rank']}", m["peak_bytes"], sim[m["pipeline_rank"]])
                if abs(m["simulated_peak_bytes"] - sim[m["pipeline_rank"]]) > 1e-6:
                    failures.append(f"auto{per_rank}: the record's simulated peak {m} is not the start event's {sim}")
            for name in names:
                run = train(binary, d, name, model, text, per_rank, name)
                measured = max(m["peak_bytes"] for m in run["memory"])
                within(f"{name}, peak over ranks", measured, named_peak(auto, name))

        free = autos[2]["start"]["auto_schedule"]
        state = free["model_state_bytes"]
        # A limit nothing fits: it leaves less than one stage's microbatch. The
        # refusal names the least limit any schedule fits in.
        smallest = min(c["activation_bytes"] for c in free["measured_ms"])
        refused = train(binary, d, "refused", model, text, 2, "auto", state + 0.5 * smallest, expect=1)
        for fragment in ("pipeline.memory_limit", "no schedule fits", "pipeline.microbatches",
                         "pipeline.activation_checkpointing"):
            if fragment not in refused["output"]:
                failures.append(f"the refusal lacks '{fragment}':\n{refused['output']}")
        if "Aborted" in refused["output"] or "terminate called" in refused["output"]:
            failures.append(f"the refusal crashed:\n{refused['output']}")
        print("  refused: " + next((l for l in refused["output"].splitlines() if "no schedule fits" in l), "?")[:160])
        least = re.search(r"([0-9.]+) (B|KiB|MiB|GiB) in all", refused["output"])
        if not least:
            failures.append(f"the refusal names no least limit:\n{refused['output']}")
            least_bytes = state + 2 * free["simulated_peak_activation_bytes"]
        else:
            least_bytes = float(least.group(1)) * {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[least.group(2)]

        # A limit just above that least one (3%, over the refusal's rounding):
        # auto must choose a program whose simulated peak fits with its 10%
        # headroom, another than the unconstrained choice when that one does
        # not fit, and the measured peak must stay within what the limit leaves.
        limit = 1.03 * least_bytes
        limited = train(binary, d, "limited", model, text, 2, "auto", limit)
        record = limited["start"]["auto_schedule"]
        # What the limit leaves for activations in the layout auto chose,
        # less that layout's own model state (Note [Memory-aware auto]).
        if len(limited["model_state"]) != RANKS or record["model_state_bytes"] != max(limited["model_state"]):
            failures.append(f"limited: model state {record['model_state_bytes']}, measured {limited['model_state']}")
        budget = limit - record["model_state_bytes"]
        print(f"limit: model state {record['model_state_bytes'] / 1e6:.3f} MB + {budget / 1e6:.3f} MB for activations -> {record['chosen']}, "
              f"simulated {record['simulated_peak_activation_bytes'] / 1e6:.3f} MB (unconstrained: {free['chosen']}, "
              f"{free['simulated_peak_activation_bytes'] / 1e6:.3f} MB)")
        if free["simulated_peak_activation_bytes"] > 0.9 * budget and record["program_digest"] == free["program_digest"]:
            failures.append(f"the limited run chose the same program ({record['chosen']}), which does not fit")
        # Auto keeps 10% of the budget as headroom (Note [Memory headroom]).
        if record["simulated_peak_activation_bytes"] > 0.9 * budget * (1 + 1e-9):
            failures.append(f"the limited choice simulates {record['simulated_peak_activation_bytes']} > 0.9 * {budget}")
        for m in limited["memory"]:
            if abs(m["activation_budget_bytes"] - budget) > 1.0:
                failures.append(f"rank {m['rank']} records a budget {m['activation_budget_bytes']}, expected {budget}")
            print(f"  limited rank {m['rank']}: measured peak {m['peak_bytes'] / 1e6:.3f} MB of {budget / 1e6:.3f} MB")
            if m["peak_bytes"] > budget:
                failures.append(f"limited rank {m['rank']}: measured peak {m['peak_bytes']} exceeds {budget}")

    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("activation memory: measured within 10% of simulated; auto keeps to the limit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
