#!/usr/bin/python3
"""A Pipeforge schedule runs in PyTorch (issue 11, point 1).

`pipeforge schedule ... --csv` writes schedules in PyTorch's CSV format: without
--lower the compute_only form (F, B, I, W and OVERLAP_F_B cells, empty cells
for idle steps), with --lower the compute_comms form (SEND/RECV added, I,W
merged into B). This test writes several, loads each into
torch.distributed.pipelining's `_PipelineScheduleRuntime._load_csv` and runs
one training step of a small MLP cut by hand into eager nn.Module stages, on 2
Gloo ranks on 127.0.0.1. Each rank checks the microbatch losses and its
stages' gradients against the same model run whole in one process on the whole
batch (mse, mean): mean of the microbatch losses vs the batch loss, and
gradients, within rtol 1e-5, atol 1e-6 (float32; the pipeline sums 4
microbatch gradients where the reference does one batch matmul).

compute_comms CSVs carry no REDUCE_GRAD, so PyTorch leaves their gradients
unscaled (the sum over microbatches); the test then divides by the number of
microbatches, which is what REDUCE_GRAD's perform_reduce_grad does.

Usage: test_schedule_csv_in_pytorch.py PIPEFORGE_BINARY
Exit 77 (skipped) when this Python's torch cannot run the CSV runtime.
"""
import json
import os
import re
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interop_common as common  # noqa: E402

RANKS = 2
MICROBATCHES = 4
BATCH = 8

# (label, pipeforge schedule arguments, stages)
CASES = [
    ("GPipe", ["--name", "GPipe"], 2),
    ("1F1B", ["--name", "1F1B"], 2),
    ("Interleaved1F1B", ["--name", "Interleaved1F1B"], 4),
    ("LoopedBFS", ["--name", "LoopedBFS"], 4),
    ("InterleavedZeroBubble", ["--name", "InterleavedZeroBubble"], 4),
    ("ZBVZeroBubble", ["--name", "ZBVZeroBubble"], 4),
    ("DualPipeV", ["--name", "DualPipeV"], 4),
    ("MegatronInterleaved", ["--name", "MegatronInterleaved"], 4),
    ("auto, 1 stage per rank", ["--name", "auto", "--costs", "1,2,1"], 2),
    ("auto, loop layout", ["--name", "auto", "--costs", "1,1.3,0.7,0.1"], 4),
    ("auto, v layout", ["--name", "auto", "--costs", "1,1.3,0.7,0.1", "--layout", "v"], 4),
    ("1F1B --lower", ["--name", "1F1B", "--lower"], 2),
    ("InterleavedZeroBubble --lower", ["--name", "InterleavedZeroBubble", "--lower"], 4),
    ("ZBVZeroBubble --lower", ["--name", "ZBVZeroBubble", "--lower"], 4),
]

UNITS = 4  # the model: 4 units, cut into 2 or 4 stages of consecutive units


def make_units():
    import torch
    import torch.nn as nn

    torch.manual_seed(7)
    return [nn.Sequential(nn.Linear(8, 16), nn.Tanh()), nn.Sequential(nn.Linear(16, 16), nn.Tanh()),
            nn.Sequential(nn.Linear(16, 16), nn.Tanh()), nn.Linear(16, 4)]


def make_batch():
    import torch

    g = torch.Generator().manual_seed(3)
    return torch.randn(BATCH, 8, generator=g), torch.randn(BATCH, 4, generator=g)


def stages_of_row(row: str) -> list:
    """The stages whose compute actions appear in one CSV row (one rank)."""
    return sorted({int(s) for s in re.findall(r"(?<![A-Z_\d])(\d+)[FIWB]\d+", row)})


def rank_main(rank: int, world: int, cases: list, out_dir: str) -> None:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    x, y = make_batch()
    results = []
    for case in cases:
        num_stages, csv_path, fmt = case["stages"], case["csv"], case["format"]
        per_stage = UNITS // num_stages

        # The reference: the whole model, the whole batch, one process.
        units = make_units()
        whole = nn.Sequential(*units)
        ref_loss = F.mse_loss(whole(x), y)
        ref_loss.backward()
        ref_grads = {id(p): p.grad.clone() for p in whole.parameters()}
        whole.zero_grad(set_to_none=True)

        with open(csv_path) as f:
            rows = f.read().splitlines()
        local = stages_of_row(rows[rank])
        modules = {s: nn.Sequential(*units[s * per_stage:(s + 1) * per_stage]) for s in local}
        stages = [PipelineStage(modules[s], s, num_stages, torch.device("cpu")) for s in local]
        schedule = _PipelineScheduleRuntime(stages, MICROBATCHES, loss_fn=F.mse_loss,
                                            scale_grads=fmt == "compute_only")
        schedule._load_csv(csv_path, format=fmt)

        args = (x,) if 0 in local else ()
        losses = []
        kwargs = {"target": y, "losses": losses} if num_stages - 1 in local else {}
        schedule.step(*args, **kwargs)
        if fmt == "compute_comms":
            for stage in stages:
                stage.scale_grads(MICROBATCHES)  # REDUCE_GRAD's scaling (see the module docstring)

        record = {"case": case["label"], "rank": rank, "stages": local, "grad_max_abs_diff": 0.0, "grads_close": True}
        for s in local:
            for p in modules[s].parameters():
                ref = ref_grads[id(p)]
                record["grad_max_abs_diff"] = max(record["grad_max_abs_diff"], (p.grad - ref).abs().max().item())
                record["grads_close"] &= torch.allclose(p.grad, ref, rtol=common.RTOL, atol=common.ATOL)
        if losses:
            mean = torch.stack([l.detach() for l in losses]).mean()
            record["microbatch_losses"] = len(losses)
            record["loss"] = mean.item()
            record["ref_loss"] = ref_loss.item()
            record["loss_close"] = torch.allclose(mean, ref_loss, rtol=common.RTOL, atol=common.ATOL)
        results.append(record)
    with open(os.path.join(out_dir, f"rank_{rank}.json"), "w") as f:
        json.dump(results, f)


def main() -> None:
    binary = sys.argv[1]
    common.require_pipelining()
    with common.temp_dir("pf-interop-csv-") as d:
        cases = []
        for i, (label, args, stages) in enumerate(CASES):
            path = os.path.join(d, f"case_{i}.csv")
            common.run_pipeforge(binary, "schedule", *args, "--ranks", str(RANKS), "--stages", str(stages),
                                 "--microbatches", str(MICROBATCHES), "--csv", path)
            fmt = "compute_comms" if "--lower" in args else "compute_only"
            cases.append({"label": label, "stages": stages, "csv": path, "format": fmt})
        common.run_ranks(RANKS, rank_main, cases, d)
        records = []
        for r in range(RANKS):
            with open(os.path.join(d, f"rank_{r}.json")) as f:
                records += json.load(f)

    failures = []
    for case in cases:
        mine = [r for r in records if r["case"] == case["label"]]
        held = sorted(s for r in mine for s in r["stages"])
        if held != list(range(case["stages"])):
            failures.append(f"{case['label']}: the ranks held stages {held}, expected 0..{case['stages'] - 1}")
        loss = [r for r in mine if "loss" in r]
        if len(loss) != 1 or loss[0]["microbatch_losses"] != MICROBATCHES:
            failures.append(f"{case['label']}: expected {MICROBATCHES} microbatch losses on one rank, got {loss}")
            continue
        loss = loss[0]
        grad_diff = max(r["grad_max_abs_diff"] for r in mine)
        ok = loss["loss_close"] and all(r["grads_close"] for r in mine)
        print(f"{case['label']:32s} {case['format']:13s} loss {loss['loss']:.8f} (reference {loss['ref_loss']:.8f}, "
              f"|diff| {abs(loss['loss'] - loss['ref_loss']):.2e}), max |grad diff| {grad_diff:.2e}  "
              f"{'ok' if ok else 'MISMATCH'}")
        if not ok:
            failures.append(f"{case['label']}: loss or gradients differ from the single-process reference beyond "
                            f"rtol {common.RTOL}, atol {common.ATOL}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print(f"{len(cases)} Pipeforge schedules ran in PyTorch's _PipelineScheduleRuntime with the reference's loss "
          f"and gradients (rtol {common.RTOL}, atol {common.ATOL})")


if __name__ == "__main__":
    main()
