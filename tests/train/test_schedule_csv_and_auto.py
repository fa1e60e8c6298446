#!/usr/bin/python3
"""`pipeline.schedule_csv` with PyTorch's own CSVs, and `pipeline.schedule: auto`.

The zoo's mlp, cut into 4 stages, trained 4 steps on 2 Gloo ranks (2 stages
per rank, 4 microbatches, mse, SGD with momentum and weight decay):
  * with a named schedule (InterleavedZeroBubble, ZBVZeroBubble);
  * with `schedule_csv:` files that torch.distributed.pipelining wrote for the
    same schedules: ScheduleInterleavedZeroBubble / ScheduleZBVZeroBubble
    objects built on stand-in stages (no process group; the constructors only
    read the stages' indices and group fields), dumped with `_dump_csv` in both
    formats, compute_only and compute_comms;
  * with `schedule: auto`, which profiles the stages and picks a schedule.
Checks:
  * every CSV run equals its named run exactly (losses and final parameters
    bitwise): the CSV holds the same program;
  * every run equals single-process PyTorch training of the unsplit model on the
    same rows (interop_common.batch_rows), each microbatch's loss divided by
    the microbatch count before its backward, torch.optim.SGD(foreach=False),
    within rtol 1e-4, atol 1e-5 (float32; schedules differ from one another in
    the order gradients of microbatches are summed);
  * auto prints its choice and the named schedules it was measured against,
    records them in metrics.jsonl's start event, and writes the program to
    <output.dir>/auto_schedule.csv, which trains again through schedule_csv
    to the same losses and parameters, bitwise;
  * a malformed CSV, a CSV for other ranks, stages or microbatches, and both
    keys at once are refused before training, naming the file and the fix.

Usage: test_schedule_csv_and_auto.py PIPEFORGE_BINARY ZOO_DIR
Exit 77 (skipped) when this Python's torch lacks torch.distributed.pipelining.
"""
import json
import os
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import interop_common as common  # noqa: E402

RANKS = 2
PER_RANK = 2
STAGES = RANKS * PER_RANK
MICROBATCHES = 4
STEPS = 4
BATCH = 8
ROWS = 24
VAL_FRACTION = 0.25
SEED = 3
LR, MOMENTUM, WEIGHT_DECAY = 0.05, 0.9, 0.01
RTOL, ATOL = 1e-4, 1e-5


class StandInStage:
    """What the schedule constructors read from a pipeline stage (as in
    tests/schedules/pytorch/dump_pytorch_orders.py)."""

    def __init__(self, stage_index, num_stages, group_size, group_rank):
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.group_size = group_size
        self.group_rank = group_rank
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1
        self.submod = None
        self.stage_index_to_group_rank = {}


def write_pytorch_csvs(d: str) -> dict:
    """{label: path} of the CSVs PyTorch's schedules dump for 2 ranks x 2 stages."""
    import logging
    from torch.distributed.pipelining import schedules as S

    logging.getLogger(S.__name__).setLevel(logging.ERROR)
    out = {}
    # Rank 0's stages: 0 and 2 in a loop, 0 and 3 in a V.
    for cls, name, rank0 in ((S.ScheduleInterleavedZeroBubble, "InterleavedZeroBubble", [0, 2]),
                             (S.ScheduleZBVZeroBubble, "ZBVZeroBubble", [0, 3])):
        schedule = cls([StandInStage(i, STAGES, RANKS, 0) for i in rank0], MICROBATCHES)
        for fmt in ("compute_only", "compute_comms"):
            path = os.path.join(d, f"{name}.{fmt}.csv")
            schedule._dump_csv(path, format=fmt)
            out[f"{name} {fmt}"] = (name, path)
    return out


def write_data(d: str) -> str:
    import torch

    g = torch.Generator().manual_seed(5)
    x = torch.randn(ROWS, 8, generator=g)
    path = os.path.join(d, "data.pt")
    torch.save({"inputs": x, "targets": torch.tanh(x @ torch.randn(8, 4, generator=g))}, path)
    return path


def config_text(d: str, name: str, split_dir: str, data: str, schedule_line: str) -> str:
    return f"""model: {{split_dir: {split_dir}}}
pipeline:
  {schedule_line}
  microbatches: {MICROBATCHES}
  stages_per_rank: {PER_RANK}
loss: mse
optimizer: {{name: sgd, lr: {LR}, momentum: {MOMENTUM}, weight_decay: {WEIGHT_DECAY}}}
lr_schedule: {{decay: constant, warmup_steps: 0}}
data: {{format: tensors, path: {data}, val_fraction: {VAL_FRACTION}}}
training: {{steps: {STEPS}, global_batch_size: {BATCH}, seed: {SEED}, eval_every: 0}}
checkpoint: {{dir: {os.path.join(d, name, 'ckpt')}}}
distributed: {{timeout_s: 60}}
output: {{dir: {os.path.join(d, name, 'out')}}}
"""


def write_config(d: str, name: str, *args) -> str:
    path = os.path.join(d, name + ".yaml")
    with open(path, "w") as f:
        f.write(config_text(d, name, *args))
    return path


def train(binary: str, d: str, model: str, name: str, *args) -> dict:
    """Trains; returns {"stdout", "losses", "params", "start"} (start: metrics' start event)."""
    import torch

    config = write_config(d, name, *args)
    # One intra-op thread per rank, as the reference (Note [Thread count] in tests/interop).
    stdout = common.run_pipeforge(binary, "train", "--config", config, "--nproc", str(RANKS),
                                  env={"OMP_NUM_THREADS": "1"})
    trained = os.path.join(d, name, "trained.pt")
    common.run_pipeforge(binary, "export", os.path.join(d, name, "ckpt"), "--model", model, "--out", trained)
    with open(os.path.join(d, name, "out", "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    losses = [r["loss"] for r in sorted((r for r in records if r["event"] == "train"), key=lambda r: r["step"])]
    start = next(r for r in records if r["event"] == "start")
    params = {k: v.detach() for k, v in torch.jit.load(trained).named_parameters()}
    return {"stdout": stdout, "losses": losses, "params": params, "start": start}


def reference(model: str, data: str) -> tuple:
    """Single-process PyTorch: (losses, {fqn: final parameter})."""
    import torch
    import torch.nn.functional as F

    module = torch.jit.load(model)
    module.train()
    tensors = torch.load(data)
    inputs, targets = tensors["inputs"], tensors["targets"]
    train_rows = common.training_rows(inputs.size(0), VAL_FRACTION)
    opt = torch.optim.SGD(module.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY, foreach=False)
    losses = []
    for step in range(STEPS):
        rows = torch.tensor(common.batch_rows(SEED, train_rows, step, BATCH))
        x, y = inputs[:train_rows].index_select(0, rows), targets[:train_rows].index_select(0, rows)
        total = 0.0
        for xm, ym in zip(x.tensor_split(MICROBATCHES), y.tensor_split(MICROBATCHES)):
            loss = F.mse_loss(module(xm), ym) / MICROBATCHES
            loss.backward()
            total += loss.item()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total)
    return losses, {k: v.detach().clone() for k, v in module.named_parameters()}


def compare(torch, name: str, got: dict, want_losses: list, want_params: dict, exact: bool) -> list:
    """Problems of `got` against the wanted losses and parameters; prints the differences."""
    problems = []
    losses = got["losses"]
    if len(losses) != STEPS:
        return [f"{name}: {len(losses)} losses for {STEPS} steps"]
    loss_diff = max(abs(a - b) for a, b in zip(losses, want_losses))
    param_diff = 0.0
    if sorted(got["params"]) != sorted(want_params):
        problems.append(f"{name}: parameter names differ: {sorted(got['params'])} vs {sorted(want_params)}")
    for fqn in sorted(set(got["params"]) & set(want_params)):
        a, b = got["params"][fqn], want_params[fqn]
        param_diff = max(param_diff, (a - b).abs().max().item())
        same = torch.equal(a, b) if exact else torch.allclose(a, b, rtol=RTOL, atol=ATOL)
        if not same:
            problems.append(f"{name}: {fqn} differs by up to {(a - b).abs().max().item():.3g}")
    if exact and losses != want_losses:
        problems.append(f"{name}: losses {losses} != {want_losses}")
    if not exact and not all(abs(a - b) <= ATOL + RTOL * abs(b) for a, b in zip(losses, want_losses)):
        problems.append(f"{name}: losses {losses} vs {want_losses}")
    print(f"  {name:44s} max |loss diff| {loss_diff:.2e}  max |param diff| {param_diff:.2e}  "
          f"{'bitwise' if exact else f'rtol {RTOL} atol {ATOL}'}: {'ok' if not problems else 'MISMATCH'}")
    return problems


def refused(binary: str, config: str, nproc: int, fragments: list) -> list:
    r = subprocess.run([binary, "train", "--config", config, "--nproc", str(nproc)], capture_output=True, text=True)
    text = r.stdout + r.stderr
    problems = []
    if r.returncode == 0:
        problems.append(f"{config}: accepted")
    if "Aborted" in text or "terminate called" in text:
        problems.append(f"{config}: crashed:\n{text}")
    missing = [f for f in fragments if f not in text]
    if missing:
        problems.append(f"{config}: the message lacks {missing}:\n{text}")
    print(f"  refused {os.path.basename(config):28s} exit {r.returncode}: {text.strip().splitlines()[0] if text.strip() else ''}")
    return problems


def main() -> None:
    binary, zoo = sys.argv[1], sys.argv[2]
    torch = common.require_pipelining()
    torch.set_num_threads(1)
    model = os.path.join(zoo, "mlp.pt")
    failures = []
    with common.temp_dir("pf-schedule-csv-") as d:
        split_dir = os.path.join(d, "mlp_4")
        spec = split_dir + ".yaml"
        with open(spec, "w") as f:
            f.write("split_points:\n  blocks.1: BEGINNING\n  blocks.3: BEGINNING\n  blocks.5: BEGINNING\n")
        common.run_pipeforge(binary, "split", model, "--spec", spec, "--out", split_dir)
        data = write_data(d)
        csvs = write_pytorch_csvs(d)
        want_losses, want_params = reference(model, data)

        runs = {}
        for name in ("InterleavedZeroBubble", "ZBVZeroBubble"):
            runs[name] = train(binary, d, model, name, split_dir, data, f"schedule: {name}")
        for label, (name, path) in csvs.items():
            runs[label] = train(binary, d, model, label.replace(" ", "-"), split_dir, data, f"schedule_csv: {path}")
        runs["auto"] = train(binary, d, model, "auto", split_dir, data, "schedule: auto")
        auto_csv = os.path.join(d, "auto", "out", "auto_schedule.csv")
        if os.path.exists(auto_csv):
            runs["auto_schedule.csv"] = train(binary, d, model, "auto-csv", split_dir, data, f"schedule_csv: {auto_csv}")
        else:
            failures.append(f"auto wrote no {auto_csv}")

        print(f"reference losses {' '.join(f'{l:.6f}' for l in want_losses)}")
        for label, (name, path) in csvs.items():
            got = runs[label]
            failures += compare(torch, f"{label} CSV vs {name}", got, runs[name]["losses"], runs[name]["params"], True)
            if f"schedule {path} (CSV)" not in got["stdout"]:
                failures.append(f"{label}: the progress does not name the schedule as {path}:\n{got['stdout']}")
            if got["start"].get("schedule") != path:
                failures.append(f"{label}: metrics' start event names the schedule {got['start'].get('schedule')!r}")
        for label, got in runs.items():
            failures += compare(torch, f"{label} vs single-process PyTorch", got, want_losses, want_params, False)

        auto = runs["auto"]
        record = auto["start"].get("auto_schedule")
        print("auto:\n" + "\n".join(l for l in auto["stdout"].splitlines() if l.startswith("    ") or "auto" in l))
        if auto["start"].get("schedule") != "auto" or not isinstance(record, dict):
            failures.append(f"auto: the start event records no choice: {auto['start']}")
        else:
            named = {n["name"]: n for n in record["named"]}
            timed = [n for n in named.values() if n["simulated_step_ms"] is not None]
            if not record["chosen"] or f"schedule auto: {record['chosen']} ({record['layout']} layout)" not in auto["stdout"]:
                failures.append(f"auto: the choice {record['chosen']!r} is not printed:\n{auto['stdout']}")
            if "named schedules, simulated:" not in auto["stdout"] or len(timed) < 4:
                failures.append(f"auto: the named schedules are not printed or timed: {record['named']}")
            if any(n["simulated_step_ms"] < record["simulated_step_ms"] * (1 - 1e-9) for n in timed):
                failures.append(f"auto: a named schedule simulates faster than the choice: {record}")
            if len(record["measured_ms"]) != STAGES or not all(c["F"] > 0 and c["B"] > 0 for c in record["measured_ms"]):
                failures.append(f"auto: measured costs {record['measured_ms']}")
            if "auto_schedule.csv" in runs:
                failures += compare(torch, "auto_schedule.csv CSV vs auto", runs["auto_schedule.csv"], auto["losses"],
                                    auto["params"], True)

        # Refusals, before any rank starts.
        izb_only = csvs["InterleavedZeroBubble compute_only"][1]
        malformed = os.path.join(d, "malformed.csv")
        with open(malformed, "w") as f:
            f.write("0F0,0F1,0Q2\n1F0\n")
        one_rank = os.path.join(d, "one_rank.csv")
        with open(one_rank, "w") as f:
            # All 4 stages on one rank, GPipe-like: valid, but for 1 pipeline rank.
            f.write(",".join([f"{s}F{m}" for m in range(MICROBATCHES) for s in range(STAGES)] +
                             [f"{s}B{m}" for m in range(MICROBATCHES) for s in reversed(range(STAGES))]) + "\n")
        two_stages = os.path.join(d, "two_stages.csv")  # 2 ranks, 1 stage each, 4 microbatches
        with open(two_stages, "w") as f:
            f.write("0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n")
        cases = [
            ("malformed", f"schedule_csv: {malformed}", 2, [malformed, "pipeline.schedule_csv", "CSV row 1", "0Q2"]),
            ("other ranks", f"schedule_csv: {one_rank}", 2, [one_rank, "has 1 rows (pipeline ranks) but the job has 2"]),
            ("other stages", f"schedule_csv: {two_stages}", 2, [two_stages, "runs 2 stages (0..1) but the split has 4"]),
            ("other microbatches", f"schedule_csv: {izb_only}", 2, [izb_only, "runs 4 microbatches", "pipeline.microbatches is 8"]),
            ("both keys", f"schedule: 1F1B\n  schedule_csv: {izb_only}", 2,
             ["pipeline.schedule and pipeline.schedule_csv are both set"]),
        ]
        for label, line, nproc, fragments in cases:
            text = config_text(d, "bad", split_dir, data, line)
            if label == "other microbatches":
                text = text.replace(f"microbatches: {MICROBATCHES}", "microbatches: 8")
            path = os.path.join(d, f"bad-{label.replace(' ', '-')}.yaml")
            with open(path, "w") as f:
                f.write(text)
            failures += refused(binary, path, nproc, fragments)

    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print(f"{len(runs)} runs agree: PyTorch's CSVs train bitwise as the named schedules, and every run (auto "
          f"included) as single-process PyTorch (rtol {RTOL}, atol {ATOL})")


if __name__ == "__main__":
    main()
