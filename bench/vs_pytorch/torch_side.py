"""The PyTorch side: one torch_rank.py process per rank, watched like Pipeforge's.

"Time to first step" runs from just before the driver starts the rank
processes to the end of step 1 on rank 0 (both on CLOCK_MONOTONIC, which all
processes share). Peak RSS per rank is the larger of procstat's VmHWM and the
rank's own ru_maxrss. When ranks fail, the error raised is the log of a
rank with an error of its own: the others fail after it with Gloo's
"Connection closed by peer", often before it exits, which hides the cause.
"""
import json
import os
import subprocess
import sys
import time

import procstat

RANK_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_rank.py")


def free_port() -> int:
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(job: dict, work: str) -> dict:
    name, ranks = job["name"], job["ranks"]
    job_path = os.path.join(work, name + ".torch.json")
    with open(job_path, "w") as f:
        json.dump(dict(job, port=free_port()), f)
    env = dict(os.environ, OMP_NUM_THREADS=str(job["threads"]), GLOO_SOCKET_IFNAME="lo")
    logs = [open(os.path.join(work, f"{name}.torch.rank{r}.log"), "w") for r in range(ranks)]
    t_launch = time.monotonic()
    # On a GPU every rank shares GPU 0: NCCL refuses two ranks of one host on one device unless each has a
    # host id of its own (then they talk over loopback sockets), as scripts/gpu_check.sh runs Pipeforge's.
    gpu_env = (lambda r: {"NCCL_HOSTID": f"pt-rank-{r}", "NCCL_SOCKET_IFNAME": "lo"}) if job.get("device") == "cuda" \
        else (lambda r: {})
    procs = [subprocess.Popen([sys.executable, RANK_SCRIPT, job_path, str(r)], stdout=logs[r],
                              stderr=subprocess.STDOUT, env=dict(env, **gpu_env(r))) for r in range(ranks)]
    with procstat.RankWatcher(lambda: {r: p.pid for r, p in enumerate(procs)}) as watcher:
        deadline = time.monotonic() + 900
        while any(p.poll() is None for p in procs):
            failed = [r for r, p in enumerate(procs) if p.returncode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                break
            time.sleep(0.05)
        rcs = [p.wait() for p in procs]
    for log in logs:
        log.close()
    if any(rcs):
        tails = {}
        for r, rc in enumerate(rcs):
            if rc:
                with open(logs[r].name) as f:
                    tails[r] = f.read()[-4000:]
        # A rank with an error of its own first; then one that lost its peer; then one killed here.
        lost_peer = ("Connection closed by peer", "Connection reset by peer")
        has_error = {r: "Error:" in t or "Exception:" in t for r, t in tails.items()}
        bad = min(tails, key=lambda r: (not has_error[r], any(m in tails[r] for m in lost_peer), r))
        raise RuntimeError(f"PyTorch rank {bad} exited {rcs[bad]}:\n{tails[bad]}")

    out = []
    for r in range(ranks):
        with open(f"{job_path}.rank{r}.json") as f:
            out.append(json.load(f))
    # CPU from the end of step warmup+1 to the end of the last step (as on the Pipeforge side).
    w = job["warmup"]
    cpu = sum(o["end_cpu"][-1] - o["end_cpu"][w] for o in out)
    wall = out[0]["end_t"][-1] - out[0]["end_t"][w]
    return {"step_s": out[0]["step_s"],
            "peak_kib": [max(watcher.peak_kib.get(r, 0), out[r]["maxrss_kib"]) for r in range(ranks)],
            "first_step_s": out[0]["end_t"][0] - t_launch, "parallelism": cpu / wall,
            "cpu_per_step": cpu / (len(job["rows"]) - 1 - w),
            "first_loss": next((o["first_loss"] for o in out if o["first_loss"] is not None), None),
            "gpu_mib": [o.get("gpu_mib") for o in out]}
