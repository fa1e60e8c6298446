"""The Pipeforge side: `pipeforge split`, then `pipeforge train --nproc P`.

Step times are Pipeforge's own: rank 0's `step_s` in metrics.jsonl with
`log_every: 1` (train/trainer.cpp, runStep: batch, schedule, non-finite
check, optimizer steps, zero_grad). Rank 0 writes the record of step k only
after step k+1 (Note [Deferred reports]), so the driver stamps each record
when it appears and takes "end of step 1" as the appearance of record 1
minus step 2's step_s. The rank processes are the launcher's children (their
RANK variable says which); procstat watches them.

A job either names its cuts (`cuts`: both sides split at those FQNs) or asks
Pipeforge to choose them (`split_policy`: `num_stages` + `policy: cost` with
one microbatch as `example_inputs`); then the cuts the split made are read
back from the split folder (split_cuts) for PyTorch to use, and with
`schedule: auto` the run's choice, its measured per-stage costs and its
simulated times come from the start record of metrics.jsonl.
"""
import json
import os
import shutil
import subprocess
import time

import models
import procstat
from torch_side import free_port

# job "adamw" (vs_pytorch.py --adamw) -> the train config's optimizer keys. loop: neither key,
# LibTorch's per-parameter loop, also for a job without "adamw" (bench/activation_checkpointing.py).
ADAMW_KEYS = {"loop": "", "foreach": ", foreach: true", "fused": ", fused: true"}


def write_spec(path: str, job: dict) -> None:
    with open(path, "w") as f:
        if "split_policy" in job:
            p = job["split_policy"]
            f.write(f"num_stages: {p['num_stages']}\npolicy: {p['policy']}\nexample_inputs:\n"
                    + "".join(f"  - {json.dumps(e)}\n" for e in p["example_inputs"]))
        else:
            points = models.split_points(job["cuts"])
            f.write("split_points:\n" + "".join(f"  {fqn}: {where}\n" for fqn, where in points))


def split_cuts(binary: str, split_dir: str) -> list:
    """The cuts a split made, as FQNs that PyTorch's pipeline() takes (see
    models.split_points). pipe.json lists each stage's parameters, inputs and
    outputs but not where it begins; `pipeforge inspect DIR --format json`
    shows the same split folder with each stage's graph nodes in program
    order, a module call as {"kind": "call", "callee": FQN}. The cut before
    stage s is the BEGINNING of its first call, or, when stage s starts with
    a plain op, the END of stage s-1's last call. Raises RuntimeError when
    neither holds (a cut between two ops of one module: no FQN names it)."""
    r = subprocess.run([binary, "inspect", split_dir, "--format", "json"], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"pipeforge inspect {split_dir} exited {r.returncode}: {r.stderr.strip()}")
    stages = json.loads(r.stdout)["stages"]
    body = [[n for n in st["nodes"] if n["kind"] not in ("inputs", "outputs")] for st in stages]
    cuts = []
    for s in range(1, len(body)):
        if body[s] and body[s][0]["kind"] == "call":
            cuts.append(body[s][0]["callee"])
        elif body[s - 1] and body[s - 1][-1]["kind"] == "call":
            cuts.append([body[s - 1][-1]["callee"], "END"])
        else:
            first = body[s][0]["op"] if body[s] else "nothing"
            raise RuntimeError(f"the cut before stage {s} falls between two ops (stage {s} starts with {first}, "
                               f"owner '{body[s][0]['owner'] if body[s] else ''}'): no module FQN names it")
    return cuts


def write_config(path: str, job: dict, split_dir: str, out_dir: str) -> None:
    """The training config. Job "device" cuda: every rank on GPU 0 (`cuda:0`, see run); job
    "precision": `training.precision` (fp32, or bf16: autocast with fp32 master weights)."""
    opt = job["optimizer"]
    device = ", device: 'cuda:0'" if job.get("device") == "cuda" else ""
    # bench/activation_checkpointing.py sets it; absent: the default (none).
    ckpt = f", activation_checkpointing: {job['activation_checkpointing']}" if "activation_checkpointing" in job else ""
    impl = ADAMW_KEYS[job.get("adamw", "loop")]
    with open(path, "w") as f:
        f.write(f"""model: {{split_dir: {split_dir}}}
pipeline: {{schedule: {job['schedule']}, microbatches: {job['microbatches']}, stages_per_rank: {job['stages_per_rank']}, tensor_parallel: {job.get('tensor_parallel', 1)}{ckpt}}}
loss: cross_entropy
optimizer: {{name: adamw, lr: {opt['lr']}, betas: {opt['betas']}, eps: {opt['eps']}, weight_decay: {opt['weight_decay']}{impl}}}
lr_schedule: {{decay: constant, warmup_steps: 0}}
data: {{format: tensors, path: {job['data']}, val_fraction: 0.0}}
training: {{steps: {len(job['rows'])}, global_batch_size: {job['batch']}, seed: {job['seed']}, eval_every: 0, precision: {job.get('precision', 'fp32')}}}
distributed: {{timeout_s: 120{device}}}
output: {{dir: {out_dir}, log_every: 1, trace: false}}
""")


class _MetricsTail:
    """Stamps each new train record of metrics.jsonl with the time it was
    seen and the ranks' CPU seconds then; keeps the start record."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._offset = 0
        self._partial = ""
        self.records = []  # (seen monotonic, {rank: cpu s}, record)
        self.start = {}    # the "start" record (with auto_schedule under schedule: auto)

    def __call__(self, now: float, watcher: procstat.RankWatcher) -> None:
        try:
            with open(self.path) as f:
                f.seek(self._offset)
                text = f.read()
                self._offset = f.tell()
        except OSError:
            return
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            if line.strip():
                record = json.loads(line)
                if record.get("event") == "train":
                    self.records.append((now, dict(watcher.cpu_s), record))
                elif record.get("event") == "start":
                    self.start = record


def run(binary: str, job: dict, work: str) -> dict:
    name = job["name"]
    spec, split_dir = os.path.join(work, name + ".spec.yaml"), os.path.join(work, name + ".stages")
    config, out_dir = os.path.join(work, name + ".train.yaml"), os.path.join(work, name + ".out")
    write_spec(spec, job)
    env = dict(os.environ, OMP_NUM_THREADS=str(job["threads"]))

    t0 = time.monotonic()
    r = subprocess.run([binary, "split", job["model_file"], "--spec", spec, "--out", split_dir, "--force"],
                       capture_output=True, text=True, env=env)
    split_s = time.monotonic() - t0
    if r.returncode != 0:
        raise RuntimeError(f"pipeforge split exited {r.returncode}:\n{r.stdout}{r.stderr}")
    cuts, cuts_error = job.get("cuts"), None
    if "split_policy" in job:  # outside the split's time: the bench's own look-up
        try:
            cuts = split_cuts(binary, split_dir)
        except RuntimeError as e:
            cuts_error = str(e)

    write_config(config, job, split_dir, out_dir)
    shutil.rmtree(out_dir, ignore_errors=True)  # metrics.jsonl is appended to
    tail = _MetricsTail(os.path.join(out_dir, "metrics.jsonl"))
    log = open(os.path.join(work, name + ".train.log"), "w")
    t_launch = time.monotonic()
    by_hand = job.get("device") == "cuda" or os.environ.get("VS_PYTORCH_RANKS_BY_HAND") == "1"
    if by_hand and job["ranks"] > 1:
        # Every rank on GPU 0: NCCL refuses two ranks of one host on one device unless each has a host id of
        # its own, which one launcher cannot give, so the ranks start as torchrun would start them
        # (scripts/gpu_check.sh, two_ranks_on_gpu0). VS_PYTORCH_RANKS_BY_HAND=1 does the same on the CPU:
        # scripts/gpu_vs_pytorch.sh's rehearsal.
        port = free_port()
        procs = [subprocess.Popen([binary, "train", "--config", config], stdout=log, stderr=subprocess.STDOUT,
                                  env=dict(env, RANK=str(r), WORLD_SIZE=str(job["ranks"]), LOCAL_RANK=str(r),
                                           LOCAL_WORLD_SIZE=str(job["ranks"]), MASTER_ADDR="127.0.0.1",
                                           MASTER_PORT=str(port), NCCL_HOSTID=f"pf-rank-{r}",
                                           NCCL_SOCKET_IFNAME="lo"))
                 for r in range(job["ranks"])]
        with procstat.RankWatcher(lambda: {r: p.pid for r, p in enumerate(procs)}, tail) as watcher:
            rc = max(p.wait() for p in procs)
    else:
        # One rank: the process itself trains (no launcher between).
        nproc = ["--nproc", str(job["ranks"])] if job["ranks"] > 1 else []
        proc = subprocess.Popen([binary, "train", "--config", config] + nproc, stdout=log, stderr=subprocess.STDOUT,
                                env=env)
        ranks = (lambda: procstat.rank_pids(proc.pid)) if nproc else (lambda: {0: proc.pid})
        with procstat.RankWatcher(ranks, tail) as watcher:
            rc = proc.wait()
    log.close()
    if rc != 0:
        with open(log.name) as f:
            raise RuntimeError(f"pipeforge train exited {rc}:\n{f.read()[-4000:]}")

    by_step = {rec["step"]: (seen, cpu, rec) for seen, cpu, rec in tail.records}
    steps = len(job["rows"])
    if sorted(by_step) != list(range(1, steps + 1)):
        raise RuntimeError(f"metrics.jsonl has train records for steps {sorted(by_step)}, expected 1..{steps}")
    step_s = [by_step[k][2]["step_s"] for k in range(1, steps + 1)]
    # Record k appears when step k+1 ends; CPU from the end of step warmup+1 to the end of the last step.
    w = job["warmup"]
    (t_a, cpu_a, _), (t_b, cpu_b, _) = by_step[w], by_step[steps - 1]
    cpu = sum(cpu_b[r] - cpu_a.get(r, 0.0) for r in cpu_b)
    first_step_end = by_step[1][0] - step_s[1]
    return {"step_s": step_s, "peak_kib": [watcher.peak_kib.get(r) for r in range(job["ranks"])],
            "split_s": split_s, "first_step_s": split_s + (first_step_end - t_launch),
            "parallelism": cpu / (t_b - t_a),
            "cpu_per_step": cpu / (steps - 1 - w), "first_loss": by_step[1][2]["loss"],
            "cuts": cuts, "cuts_error": cuts_error, "auto_schedule": tail.start.get("auto_schedule"),
            "gpu_mib": gpu_peaks(os.path.join(out_dir, "metrics.jsonl"), job["ranks"])}


def gpu_peaks(metrics: str, ranks: int) -> list:
    """Each rank's torch.cuda.max_memory_allocated in MiB, from the activation_memory records the run
    ends with (None on the CPU)."""
    peaks = [None] * ranks
    with open(metrics) as f:
        for line in f:
            record = json.loads(line)
            if record.get("event") == "activation_memory" and record.get("rank", ranks) < ranks:
                peaks[record["rank"]] = record.get("max_memory_allocated_mib")
    return peaks

