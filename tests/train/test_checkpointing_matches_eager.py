#!/usr/bin/python3
"""Training with activation checkpointing equals eager training in PyTorch.

`pipeforge train --nproc 2` with `pipeline.activation_checkpointing: full`
(every stage's forward keeps no graph and its backward recomputes it), and
with `{every_n: k}` (each stage recomputes only its k-th, 2k-th, ... submodule
call and keeps the graph of the rest), and with `{microbatches: k}` (Megatron's
partial recompute: the first k microbatches in flight on each stage keep their
graph, later ones are recomputed), trains
the zoo's `gpt` (embedding and head tied across the two ends of the pipeline)
for 4 steps of SGD with momentum, with 1F1B and with ZBVZeroBubble (split
backward: I recomputes, W works from the recomputed graph). The same steps run
in one PyTorch process: torch.jit.load(gpt.pt) on the same rows
(interop_common.batch_rows mirrors Pipeforge's sampler), cut into the same
microbatches, each microbatch's loss divided by their number before its
backward. Losses and final parameters (read back from `pipeforge export`)
must agree within rtol 1e-4, atol 1e-5: float32 along different but
equivalent paths, as test_pt2_training_matches_eager.py; the measured
differences are printed. `gpt` has no dropout (PyTorch's single process draws
masks in another order than the pipeline's ranks); dropout replay is checked
against training without checkpointing in runtime_checkpointing_test.

With bf16 autocast and dropout active (the zoo's `gpt_dropout`, ZBVZeroBubble),
checkpointing (full, every_n 2 and microbatches 1) must change nothing at all: losses, grad
norms and trained parameters bit for bit equal to the same run without it.

Then the refusals through the binary: `{every_n: 0}` and a misspelt value
stop `pipeforge train` with exit 1 and the key named.

Usage: test_checkpointing_matches_eager.py PIPEFORGE_BINARY ZOO_DIR
"""
import json
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import interop_common as common  # noqa: E402

STEPS = 4
MICROBATCHES = 4
ROWS_PER_MB = 2
ROWS = 40
SEED = 7
RTOL, ATOL = 1e-4, 1e-5
LR, MOMENTUM = 0.05, 0.9
SCHEDULES = {"1F1B": 1, "ZBVZeroBubble": 2}  # schedule -> stages per rank
# (schedule, activation_checkpointing) runs compared with PyTorch.
RUNS = [("1F1B", "full"), ("ZBVZeroBubble", "full"), ("1F1B", "{every_n: 2}"), ("ZBVZeroBubble", "{every_n: 1}"),
        # Partial recompute (Note [Partial recompute]): the first k microbatches in flight keep their graph.
        ("1F1B", "{microbatches: 1}"), ("ZBVZeroBubble", "{microbatches: 2}")]
RANKS = 2


def make_data(torch, path: str) -> None:
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 64, (ROWS, 17), generator=g)
    torch.save({"inputs": tokens[:, :-1].contiguous(), "targets": tokens[:, 1:].contiguous()}, path)


def train_eager(torch, model_path: str, data_path: str):
    model = torch.jit.load(model_path)
    model.train()
    data = torch.load(data_path)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, foreach=False)
    losses = common.train_token_steps(torch, model, opt, data["inputs"], data["targets"], SEED, range(STEPS),
                                      MICROBATCHES, ROWS_PER_MB)
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def write_config(path: str, run: str, model_path: str, data_path: str, schedule: str, checkpointing: str,
                 precision: str = "fp32") -> None:
    per_rank = SCHEDULES.get(schedule, 1)
    with open(path, "w") as f:
        f.write(f"""model: {{path: {model_path}, num_stages: {RANKS * per_rank}, policy: parameters}}
pipeline:
  schedule: {schedule}
  microbatches: {MICROBATCHES}
  stages_per_rank: {per_rank}
  activation_checkpointing: {checkpointing}
loss: cross_entropy
optimizer: {{name: sgd, lr: {LR}, momentum: {MOMENTUM}}}
lr_schedule: {{decay: constant, warmup_steps: 0}}
data: {{format: tensors, path: {data_path}, val_fraction: 0.0}}
training: {{steps: {STEPS}, global_batch_size: {ROWS_PER_MB * MICROBATCHES}, seed: {SEED}, eval_every: 0,
           precision: {precision}}}
checkpoint: {{dir: {run}/ckpt}}
distributed: {{timeout_s: 60}}
output: {{dir: {run}/out}}
""")


def train_pipeforge(torch, binary: str, d: str, model_path: str, data_path: str, schedule: str, checkpointing: str):
    run = os.path.join(d, f"ckpt-{schedule}-{''.join(c for c in checkpointing if c.isalnum())}")
    write_config(run + ".yaml", run, model_path, data_path, schedule, checkpointing)
    common.run_pipeforge(binary, "train", "--config", run + ".yaml", "--nproc", str(RANKS),
                         env={"OMP_NUM_THREADS": "1"})
    trained = os.path.join(run, "trained.pt")
    common.run_pipeforge(binary, "export", os.path.join(run, "ckpt"), "--model", model_path, "--out", trained)
    with open(os.path.join(run, "out", "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    losses = [r["loss"] for r in sorted((r for r in records if r["event"] == "train"), key=lambda r: r["step"])]
    state = torch.jit.load(trained).state_dict()
    return losses, {k: v.detach() for k, v in state.items()}


def check_bf16_dropout(torch, binary: str, d: str, zoo: str, data_path: str) -> list:
    """bf16 autocast with dropout on ZBV: checkpointing changes nothing, bit for bit (the recompute runs
    in the forward's autocast and replays its dropout masks)."""
    model_path = os.path.join(zoo, "gpt_dropout.pt")
    runs = {}
    for checkpointing in ("none", "full", "{every_n: 2}", "{microbatches: 1}"):
        run = os.path.join(d, f"bf16-{''.join(c for c in checkpointing if c.isalnum())}")
        write_config(run + ".yaml", run, model_path, data_path, "ZBVZeroBubble", checkpointing, "bf16")
        common.run_pipeforge(binary, "train", "--config", run + ".yaml", "--nproc", str(RANKS),
                             env={"OMP_NUM_THREADS": "1"})
        trained = os.path.join(run, "trained.pt")
        common.run_pipeforge(binary, "export", os.path.join(run, "ckpt"), "--model", model_path, "--out", trained)
        with open(os.path.join(run, "out", "metrics.jsonl")) as f:
            train = sorted((r for r in map(json.loads, f) if r["event"] == "train"), key=lambda r: r["step"])
        runs[checkpointing] = ([(r["loss"], r["grad_norm"]) for r in train], torch.jit.load(trained).state_dict())
    a_log, a_state = runs["none"]
    problems = []
    for checkpointing in ("full", "{every_n: 2}", "{microbatches: 1}"):
        b_log, b_state = runs[checkpointing]
        if len(a_log) != STEPS or a_log != b_log:
            problems.append(f"bf16 losses and grad norms differ with {checkpointing}: {a_log} vs {b_log}")
        differing = [k for k in a_state if not torch.equal(a_state[k], b_state[k])]
        if differing:
            problems.append(f"bf16 parameters differ with {checkpointing}: {differing[:4]}")
        print(f"bf16 + dropout, ZBVZeroBubble: checkpointing {checkpointing} vs none: {len(a_log)} steps, losses and "
              f"grad norms {'identical' if a_log == b_log else 'DIFFERENT'}, {len(differing)} parameters differ")
    return problems


def check_refusals(binary: str, d: str, model_path: str, data_path: str) -> list:
    problems = []
    cases = [("{every_n: 0}", ["pipeline.activation_checkpointing.every_n must be an integer in [1, ", "got '0'"]),
             ("fulll", ["pipeline.activation_checkpointing must be none, full or a map {every_n: k} or "
                        "{microbatches: k}", "'fulll'"]),
             ("{every_n: 2, microbatches: 1}", ["takes every_n (which submodule calls) or microbatches", "not both"])]
    for i, (value, fragments) in enumerate(cases):
        run = os.path.join(d, f"refuse-{i}")
        write_config(run + ".yaml", run, model_path, data_path, "1F1B", value)
        problems += common.expect_refusal(binary, run + ".yaml", f"activation_checkpointing: {value}", fragments,
                                          RANKS)
    return problems


def main() -> None:
    binary, zoo = sys.argv[1], sys.argv[2]
    try:
        import torch
    except ImportError as e:
        common.skip(f"no torch in {sys.executable}: {e}")
    torch.set_num_threads(1)
    model_path = os.path.join(zoo, "gpt.pt")
    failures = []
    with common.temp_dir("pf-ckpt-train-") as d:
        data_path = os.path.join(d, "data.pt")
        make_data(torch, data_path)
        ref_losses, ref_state = train_eager(torch, model_path, data_path)
        initial = torch.jit.load(model_path).state_dict()
        for schedule, checkpointing in RUNS:
            losses, state = train_pipeforge(torch, binary, d, model_path, data_path, schedule, checkpointing)
            problems, loss_diff, diff = common.compare_training(torch, losses, ref_losses, state, ref_state, RTOL,
                                                                ATOL, initial)
            print(f"checkpointing {checkpointing:13s} {RANKS} ranks {schedule:14s} max |loss diff| {loss_diff:.2e}  "
                  f"max |param diff| {diff:.2e}  {'ok' if not problems else 'MISMATCH'}", flush=True)
            failures += [f"{schedule} {checkpointing}: {p}" for p in problems]
        failures += check_bf16_dropout(torch, binary, d, zoo, data_path)
        failures += check_refusals(binary, d, model_path, data_path)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print(f"training with activation checkpointing equals eager PyTorch training (rtol {RTOL}, atol {ATOL})")


if __name__ == "__main__":
    main()
