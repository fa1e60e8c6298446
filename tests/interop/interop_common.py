"""What the interop tests share: the skip rule, Gloo ranks on loopback, and a
Python mirror of how `data.format: tensors` draws its batches.

The tests run with the build's Python (PIPEFORGE_PYTHON). When its torch has
no `torch.distributed.pipelining` runtime that loads schedule CSVs (Debian's
torch 1.13 in the system build), they print why and exit 77, which ctest
reports as skipped (SKIP_RETURN_CODE 77).
"""
import datetime
import inspect
import os
import socket
import subprocess
import sys
import tempfile

SKIP = 77

# Comparisons in both tests: float32 values computed along different (but
# equivalent) paths. Stated once so every report quotes the same numbers.
RTOL = 1e-5
ATOL = 1e-6


def close(a: float, b: float) -> bool:
    """|a - b| <= ATOL + RTOL * |b|, torch.allclose's rule for two numbers."""
    return abs(a - b) <= ATOL + RTOL * abs(b)


def skip(reason: str) -> None:
    print(f"SKIP: {reason}")
    sys.exit(SKIP)


def require_pipelining():
    """Returns torch when it can run the tests; otherwise skips (exit 77)."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        skip(f"no torch in {sys.executable}: {e}")
    if not dist.is_available() or not dist.is_gloo_available():
        skip(f"torch {torch.__version__} at {sys.executable} has no torch.distributed with Gloo")
    try:
        from torch.distributed.pipelining import schedules
    except ImportError as e:
        skip(f"torch {torch.__version__} has no torch.distributed.pipelining ({e}); these tests need its schedule "
             "CSV runtime (written against torch 2.13)")
    missing = [name for name in ("_PipelineScheduleRuntime", "Schedule1F1B", "ScheduleInterleavedZeroBubble",
                                 "ScheduleZBVZeroBubble") if not hasattr(schedules, name)]
    if missing:
        skip(f"torch {torch.__version__}'s torch.distributed.pipelining lacks {', '.join(missing)}")
    load_csv = getattr(schedules._PipelineScheduleRuntime, "_load_csv", None)
    if load_csv is None or "format" not in inspect.signature(load_csv).parameters:
        skip(f"torch {torch.__version__}'s _PipelineScheduleRuntime cannot load compute_only/compute_comms CSVs")
    return torch


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_entry(rank: int, world: int, port: int, fn, args) -> None:
    import torch
    import torch.distributed as dist

    # Loopback only: the store and Gloo's sockets on 127.0.0.1.
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        fn(rank, world, *args)  # a failure's traceback reaches the parent through mp.spawn
    finally:
        dist.destroy_process_group()


def run_ranks(world: int, fn, *args) -> None:
    """Runs fn(rank, world, *args) in `world` processes joined in one Gloo group
    on 127.0.0.1. A rank that fails ends the others (torch.multiprocessing)."""
    import torch.multiprocessing as mp

    mp.spawn(_rank_entry, args=(world, free_port(), fn, args), nprocs=world, join=True)


def run_pipeforge(binary: str, *args: str, env: dict = None) -> str:
    r = subprocess.run([binary, *args], capture_output=True, text=True,
                       env=None if env is None else dict(os.environ, **env))
    if r.returncode != 0:
        raise AssertionError(f"pipeforge {' '.join(args)} exited {r.returncode}:\n{r.stdout}{r.stderr}")
    return r.stdout


def temp_dir(prefix: str) -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix=prefix)


# --- a `pipeforge train` run and what it leaves ------------------------------

def train_records(binary: str, config: str, nproc: int, out_dir: str) -> list:
    """`pipeforge train --config config --nproc N` (one intra-op thread per
    rank), then every record of out_dir/metrics.jsonl."""
    run_pipeforge(binary, "train", "--config", config, "--nproc", str(nproc), env={"OMP_NUM_THREADS": "1"})
    import json
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def losses_of(records: list, event: str = "train") -> list:
    """The `loss` of each `event` record ("train" or "eval"), by step."""
    return [r["loss"] for r in sorted((r for r in records if r["event"] == event), key=lambda r: r["step"])]


def exported_state(torch, binary: str, ckpt: str, model: str, out: str) -> dict:
    """`pipeforge export CKPT --model MODEL --out OUT` (a TorchScript model), read back: {FQN: tensor}."""
    run_pipeforge(binary, "export", ckpt, "--model", model, "--out", out, "--force")
    return {k: v.detach() for k, v in torch.jit.load(out).state_dict().items()}


# --- the batches of `data.format: tensors` (data/tensor_dataset.cpp) ---------
#
# Each epoch visits every training row once, in a Fisher-Yates order drawn from
# (seed, stream 0 + 2, epoch, i) with data/sampling.h's SplitMix64 draws; the
# rows of step s are positions s*B .. s*B+B-1 of that endless sequence. The
# training rows are the first rows - int(rows * val_fraction).

_MASK = (1 << 64) - 1


def _mix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _draw_bits(seed: int, stream: int, step: int, slot: int) -> int:
    return _mix64(_mix64(_mix64(_mix64(seed) ^ stream) ^ step) ^ slot)


def _draw_below(bits: int, bound: int) -> int:
    return (bits * bound) >> 64


def epoch_order(seed: int, epoch: int, n: int, stream: int = 0) -> list:
    order = list(range(n))
    for i in range(n - 1, 0, -1):
        j = _draw_below(_draw_bits(seed, stream + 2, epoch, i), i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def training_rows(num_rows: int, val_fraction: float) -> int:
    return num_rows - int(num_rows * val_fraction)


def batch_rows(seed: int, train_rows: int, step: int, batch_size: int) -> list:
    """Row indices of training step `step` (0-based), as Pipeforge draws them."""
    rows = []
    for j in range(batch_size):
        k = step * batch_size + j
        rows.append(epoch_order(seed, k // train_rows, train_rows)[k % train_rows])
    return rows


def train_token_steps(torch, model, opt, inputs, targets, seed: int, steps: range, microbatches: int,
                      rows_per_mb: int) -> list:
    """Eager PyTorch doing what a Pipeforge run of `steps` (0-based) does with
    cross_entropy over token rows: the rows batch_rows draws, each
    microbatch's mean loss / microbatches backward, one optimizer step.
    Returns each step's mean loss over its microbatches."""
    import torch.nn.functional as F
    losses = []
    for step in steps:
        rows = torch.tensor(batch_rows(seed, targets.size(0), step, rows_per_mb * microbatches))
        x, y = inputs.index_select(0, rows), targets.index_select(0, rows)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for mb in range(microbatches):
            part = slice(mb * rows_per_mb, (mb + 1) * rows_per_mb)
            out = model(x[part])
            loss = F.cross_entropy(out.reshape(-1, out.size(-1)), y[part].reshape(-1))
            (loss / microbatches).backward()
            total += loss.item()
        opt.step()
        losses.append(total / microbatches)
    return losses


# --- comparing two trainings of the same model ------------------------------


def compare_training(torch, losses: list, ref_losses: list, state: dict, ref_state: dict, rtol: float, atol: float,
                     initial: dict = None) -> tuple:
    """Per-step losses and final parameters of a run against a reference run.

    Returns (problems, max |loss diff|, max |param diff|): problems is empty
    when there are as many losses as reference steps, every loss and every
    parameter is within `atol + rtol * |reference|` (torch.allclose's rule),
    the parameter names are the same and, given `initial`, training moved at
    least one parameter (a run that trained nothing proves nothing).
    """
    problems = []
    if len(losses) != len(ref_losses):
        problems.append(f"{len(losses)} losses for {len(ref_losses)} steps")
    loss_diff = max((abs(a - b) for a, b in zip(losses, ref_losses)), default=float("inf"))
    if not all(abs(a - b) <= atol + rtol * abs(b) for a, b in zip(losses, ref_losses)):
        problems.append(f"losses {losses} vs reference {ref_losses}")
    if sorted(state) != sorted(ref_state):
        problems.append(f"names differ: {sorted(set(state) ^ set(ref_state))}")
    param_diff, moved = 0.0, 0
    for k in sorted(set(state) & set(ref_state)):
        a, b = state[k], ref_state[k]
        param_diff = max(param_diff, (a.double() - b.double()).abs().max().item())
        if initial is not None:
            moved += not torch.equal(b, initial[k])
        if not torch.allclose(a, b, rtol=rtol, atol=atol):
            problems.append(f"{k}: max |diff| {(a - b).abs().max().item():.3g}")
    if initial is not None and moved == 0:
        problems.append("training moved no parameter")
    return problems, loss_diff, param_diff


def expect_refusal(binary: str, config: str, label: str, fragments: list, nproc: int = 2) -> list:
    """`pipeforge train --config config --nproc N` must exit 1 with every fragment in its output.

    Returns the problems (empty when refused as expected) and prints the refusal's last line.
    """
    r = subprocess.run([binary, "train", "--config", config, "--nproc", str(nproc)], capture_output=True, text=True)
    text = r.stdout + r.stderr
    missing = [f for f in fragments if f not in text]
    if r.returncode != 1 or missing:
        return [f"refusal '{label}': exit {r.returncode}, missing {missing}:\n{text}"]
    print(f"refused {label}: {text.strip().splitlines()[-1][:200]}")
    return []
