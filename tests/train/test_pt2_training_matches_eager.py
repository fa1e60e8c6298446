#!/usr/bin/python3
"""Pipelined training of a torch.export model equals eager training in PyTorch (issue 10).

For each `.pt2` of the zoo named below and each layout (2 and 4 ranks; 1F1B,
InterleavedZeroBubble, ZBVZeroBubble), the same 5 steps run twice:
  * Pipeforge: `pipeforge train --nproc R` with `model.path: X.pt2` (split by
    the launcher with the parameters policy), then `pipeforge export --out
    trained.pt2`, whose weights are read back with torch.export.load;
  * PyTorch, one process: torch.export.load(X.pt2).module() trained eagerly on
    the same rows (interop_common.batch_rows mirrors Pipeforge's sampler),
    cut into the same microbatches, each microbatch's loss divided by their
    number before its backward, with torch.optim.SGD.
Losses and final parameters must agree within rtol 1e-4, atol 1e-5 (float32
along different but equivalent paths; measured differences are printed).

Models: `gpt` (weights tied between the embedding and the head: one tensor in
the exported program, both ends of the pipeline) on token rows with
cross-entropy, and `multi_io_deep` (the zoo's multi-input skip model with a
deeper body, so that it has the 8 stages 4 ranks x 2 need: three inputs, a
skip connection over every middle cut, two outputs of which the first is
trained) with mse, and `regions` (a torch.no_grad() region that calls a
submodule, which must stay untrained, and a bfloat16 torch.autocast region;
Note [PT2 regions]) with mse on 2 ranks. All were exported with a static
batch, so each microbatch has exactly that many rows.

Then the refusals: a microbatch that a static export (or a dynamic one's
range) cannot take stops `pipeforge train` with exit 1 before any step, naming
the exported size and the fix; `--out x.pt2` from a TorchScript model is refused.

Usage: test_pt2_training_matches_eager.py PIPEFORGE_BINARY PT2_ZOO_DIR
"""
import json
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import interop_common as common  # noqa: E402

STEPS = 5
MICROBATCHES = 4
SEED = 7
RTOL, ATOL = 1e-4, 1e-5
LR, MOMENTUM, WEIGHT_DECAY = 0.05, 0.9, 0.01

# schedule -> stages per rank
SCHEDULES = {"1F1B": 1, "InterleavedZeroBubble": 2, "ZBVZeroBubble": 2}
RANKS = (2, 4)
# name -> (loss, rows per microbatch = the exported batch, rows in the data file)
MODELS = {"gpt": ("cross_entropy", 4, 40), "multi_io_deep": ("mse", 6, 56), "regions": ("mse", 6, 56)}
# Models with too few module calls for 8 stages: only these layouts.
ONLY = {"regions": [(2, "1F1B")]}


def make_data(torch, name: str, path: str, rows: int) -> None:
    g = torch.Generator().manual_seed(3)
    if name == "gpt":
        tokens = torch.randint(0, 64, (rows, 17), generator=g)
        torch.save({"inputs": tokens[:, :-1].contiguous(), "targets": tokens[:, 1:].contiguous()}, path)
    elif name == "regions":
        torch.save({"inputs": torch.randn(rows, 4, generator=g), "targets": torch.randn(rows, 2, generator=g)}, path)
    else:
        x, y = torch.randn(rows, 8, generator=g), torch.randn(rows, 8, generator=g)
        mask = torch.randint(0, 2, (rows, 8), generator=g)
        torch.save({"inputs": (x, y, mask), "targets": torch.randn(rows, 3, generator=g)}, path)


def loss_of(torch, kind: str, out, target):
    import torch.nn.functional as F
    if kind == "mse":
        return F.mse_loss(out, target)
    return F.cross_entropy(out.reshape(-1, out.size(-1)), target.reshape(-1))


def train_eager(torch, model_path: str, data_path: str, kind: str, rows_per_mb: int):
    model = torch.export.load(model_path).module()
    data = torch.load(data_path)
    inputs = data["inputs"] if isinstance(data["inputs"], tuple) else (data["inputs"],)
    targets = data["targets"]
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY, foreach=False)
    batch = rows_per_mb * MICROBATCHES
    losses = []
    for step in range(STEPS):
        rows = torch.tensor(common.batch_rows(SEED, targets.size(0), step, batch))
        xs = [t.index_select(0, rows) for t in inputs]
        y = targets.index_select(0, rows)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for mb in range(MICROBATCHES):
            part = slice(mb * rows_per_mb, (mb + 1) * rows_per_mb)
            out = model(*(x[part] for x in xs))
            out = out[0] if isinstance(out, (tuple, list)) else out
            loss = loss_of(torch, kind, out, y[part])
            (loss / MICROBATCHES).backward()
            total += loss.item()
        opt.step()
        losses.append(total / MICROBATCHES)
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def train_pipeforge(torch, binary: str, d: str, name: str, model_path: str, data_path: str, kind: str,
                    rows_per_mb: int, ranks: int, schedule: str):
    run = os.path.join(d, f"{name}-{ranks}-{schedule}")
    per_rank = SCHEDULES[schedule]
    config = run + ".yaml"
    with open(config, "w") as f:
        f.write(f"""model: {{path: {model_path}, num_stages: {ranks * per_rank}, policy: parameters}}
pipeline: {{schedule: {schedule}, microbatches: {MICROBATCHES}, stages_per_rank: {per_rank}}}
loss: {kind}
optimizer: {{name: sgd, lr: {LR}, momentum: {MOMENTUM}, weight_decay: {WEIGHT_DECAY}}}
lr_schedule: {{decay: constant, warmup_steps: 0}}
data: {{format: tensors, path: {data_path}, val_fraction: 0.0}}
training: {{steps: {STEPS}, global_batch_size: {rows_per_mb * MICROBATCHES}, seed: {SEED}, eval_every: 0}}
checkpoint: {{dir: {run}/ckpt}}
distributed: {{timeout_s: 60}}
output: {{dir: {run}/out}}
""")
    common.run_pipeforge(binary, "train", "--config", config, "--nproc", str(ranks), env={"OMP_NUM_THREADS": "1"})
    trained = os.path.join(run, "trained.pt2")
    common.run_pipeforge(binary, "export", os.path.join(run, "ckpt"), "--model", model_path, "--out", trained)
    with open(os.path.join(run, "out", "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    losses = [r["loss"] for r in sorted((r for r in records if r["event"] == "train"), key=lambda r: r["step"])]
    with open(os.path.join(run, "out", "stages", "pipe.json")) as f:
        stages = json.load(f)["num_stages"]
    state = torch.export.load(trained).module().state_dict()
    return losses, {k: v.detach() for k, v in state.items()}, stages


def check_refusals(binary: str, d: str, zoo: str) -> list:
    import subprocess
    import torch
    problems = []
    data_path = os.path.join(d, "gpt_data.pt")
    cases = [  # model, rows per microbatch, expected fragments
        ("gpt", 2, ["exported with a static size of 4 in dimension 0 (the batch) of input 'idx'",
                    "microbatches of 2 rows", "torch.export.Dim", "global_batch_size to 16"]),
        ("gpt_dynamic", 1, ["exported with sizes 2..64 in dimension 0", "microbatches of 1 rows"]),
    ]
    for name, rows, fragments in cases:
        run = os.path.join(d, f"refuse-{name}")
        config = run + ".yaml"
        with open(config, "w") as f:
            f.write(f"""model: {{path: {os.path.join(zoo, name + '.pt2')}, num_stages: 2, policy: parameters}}
pipeline: {{schedule: 1F1B, microbatches: {MICROBATCHES}}}
loss: cross_entropy
data: {{format: tensors, path: {data_path}, val_fraction: 0.0}}
training: {{steps: 1, global_batch_size: {rows * MICROBATCHES}, eval_every: 0}}
checkpoint: {{dir: {run}/ckpt}}
output: {{dir: {run}/out}}
""")
        r = subprocess.run([binary, "train", "--config", config, "--nproc", "2"], capture_output=True, text=True)
        text = r.stdout + r.stderr
        missing = [f for f in fragments if f not in text]
        if r.returncode != 1 or missing or os.path.exists(os.path.join(run, "ckpt")):
            problems.append(f"{name} at {rows} rows per microbatch: exit {r.returncode}, missing {missing}:\n{text}")
        else:
            print(f"refused {name} at {rows} rows per microbatch: {text.strip().splitlines()[-1][:150]}...")
    r = subprocess.run([binary, "export", os.path.join(d, "none"), "--model", os.path.join(zoo, "..", "zoo", "mlp.pt"),
                        "--out", os.path.join(d, "x.pt2")], capture_output=True, text=True)
    if r.returncode == 0:
        problems.append("export of a TorchScript model to .pt2 succeeded")
    return problems


def main() -> None:
    binary, zoo = sys.argv[1], sys.argv[2]
    import torch
    if not hasattr(torch, "export") or not hasattr(torch.export, "load"):
        common.skip(f"torch {torch.__version__} has no torch.export.load")
    torch.set_num_threads(1)
    failures = []
    with common.temp_dir("pf-pt2-train-") as d:
        for name, (kind, rows_per_mb, rows) in MODELS.items():
            model_path = os.path.join(zoo, name + ".pt2")
            data_path = os.path.join(d, name + "_data.pt")
            make_data(torch, name, data_path, rows)
            ref_losses, ref_state = train_eager(torch, model_path, data_path, kind, rows_per_mb)
            initial = torch.export.load(model_path).module().state_dict()
            for ranks in RANKS:
                for schedule in SCHEDULES:
                    if name in ONLY and (ranks, schedule) not in ONLY[name]:
                        continue
                    label = f"{name} {ranks} ranks {schedule}"
                    losses, state, stages = train_pipeforge(torch, binary, d, name, model_path, data_path, kind,
                                                            rows_per_mb, ranks, schedule)
                    problems, loss_diff, diff = common.compare_training(torch, losses, ref_losses, state, ref_state,
                                                                        RTOL, ATOL, initial)
                    print(f"{label:38s} {stages} stages  max |loss diff| {loss_diff:.2e}  max |param diff| "
                          f"{diff:.2e}  {'ok' if not problems else 'MISMATCH'}", flush=True)
                    failures += [f"{label}: {p}" for p in problems]
        failures += check_refusals(binary, d, zoo)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print(f"pipelined .pt2 training equals eager PyTorch training (rtol {RTOL}, atol {ATOL})")


if __name__ == "__main__":
    main()
