#!/usr/bin/python3
"""pipeline.tensor_parallel trains as the unsplit pipeline does, and resumes across degrees (issue 44).

The zoo's scripted `mlp` (h = relu(inp(x)), then six residual blocks
fc2(relu(fc1(h))), then out(h)) is planned from its graph into alternating
column and row linears (tensor_parallel/tp_plan.h); the parameters policy
cuts it between a column and its row, so a stage's split output is
gathered whole. Each case trains 6 steps with tensor parallel and without it,
on the same pipeline and data-parallel layout, and compares:
  - the per-step losses and the final parameters (`pipeforge export`, whole
    tensors by FQN) within rtol 1e-5 (the row-split sums add in another
    order, which AdamW's normalised step carries to ~1e-6);
  - every rank's `model_state` record: parameters, gradients and AdamW state
    of a tp rank are about 1/t of the same pipeline rank's without it.
The cases: pp2 x tp2 (1F1B), pp2 x tp2 with 2 stages per rank (ZBVZeroBubble,
whose split backward keeps f's all-reduce in I), tp2 x dp2, tp4 on one
pipeline rank, and with ZeRO: tp2 x dp2 at zero 2 and pp2 x tp2 x dp2 at
zero 1 and 3 (against the same zero stage without tp; with clipping at 0.5, so
the global gradient norm over pieces and blocks must be right). Then the tp2 run's step-3
checkpoint (whole tensors) resumes on tp1 and the tp1 run's on tp2 and tp4,
and at zero 2 and 3 the tp2 run's (the replicas' pieces gathered whole) on
tp1's pieces and tp1's shard files on tp2, as the straight runs go on. Last, the
tp2 x dp2 zero 2 run started by torchrun (4 workers) and by hand as SLURM
starts tasks (SLURM_PROCID, ...) equals the one `--nproc 4` started.

Usage: test_tensor_parallel_matches.py PIPEFORGE_BINARY ZOO_DIR
"""
import json
import os
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import interop_common as common  # noqa: E402

STEPS, MICROBATCHES, ROWS_PER_MB, SEED = 6, 4, 2, 11
RTOL, ATOL = 1e-5, 1e-6
# label -> (stages, stages per rank, schedule, data parallel, tensor parallel[, zero stage])
CASES = {
    "pp2 x tp2 1F1B": (2, 1, "1F1B", 1, 2),
    "pp2 x tp2 ZBV": (4, 2, "ZBVZeroBubble", 1, 2),
    "tp2 x dp2": (1, 1, "1F1B", 2, 2),
    "tp4": (1, 1, "1F1B", 1, 4),
    # ZeRO over the replicas of each rank's blocks, against the same ZeRO stage without tp.
    "tp2 x dp2 ZeRO-2": (1, 1, "1F1B", 2, 2, 2),
    "pp2xtp2xdp2 ZeRO-1": (2, 1, "1F1B", 2, 2, 1),
    "pp2xtp2xdp2 ZeRO-3": (4, 2, "ZBVZeroBubble", 2, 2, 3),
}


def write_config(path, run, model, data, stages, per_rank, schedule, dp, tp, zero=0, steps=STEPS):
    with open(path, "w") as f:
        f.write(f"""model: {{path: {model}, num_stages: {stages}, policy: parameters, example_inputs: [{{shape: [{ROWS_PER_MB}, 8], dtype: float32}}]}}
pipeline: {{schedule: {schedule}, microbatches: {MICROBATCHES}, stages_per_rank: {per_rank}, data_parallel: {dp}, tensor_parallel: {tp}, zero_stage: {zero}}}
loss: mse
optimizer: {{name: adamw, lr: 3.0e-3, weight_decay: 0.1{", clip_grad_norm: 0.5" if zero else ""}}}
lr_schedule: {{decay: constant, warmup_steps: 0}}
data: {{format: tensors, path: {data}, val_fraction: 0.0}}
training: {{steps: {steps}, global_batch_size: {dp * ROWS_PER_MB * MICROBATCHES}, seed: {SEED}, eval_every: 0}}
checkpoint: {{dir: {run}/ckpt, every: 3}}
distributed: {{timeout_s: 60}}
output: {{dir: {run}/out}}
""")


def train(binary, run, nproc):
    records = common.train_records(binary, run + ".yaml", nproc, os.path.join(run, "out"))
    return common.losses_of(records), {r["rank"]: r for r in records if r["event"] == "model_state"}


def exported(torch, binary, run, model):
    return common.exported_state(torch, binary, os.path.join(run, "ckpt"), model, os.path.join(run, "trained.pt"))


def check_model_state(split, whole, tp):
    """Rank r of the tp run against the rank holding the same stages without tp (tp is innermost: r // tp)."""
    problems = []
    for r, rec in split.items():
        ref = whole[r // tp]
        for key in ("param_bytes", "grad_bytes", "optimizer_bytes"):
            # Row linears' biases stay whole, and a linear whose split would leave its
            # stage without a row to end it runs whole: a little over 1/t.
            if not ref[key] / tp <= rec[key] <= 1.25 * ref[key] / tp:
                problems.append(f"rank {r}: {key} {rec[key]} for {ref[key]} without tensor parallel (tp {tp})")
    return problems


def check_other_launchers(torch, binary, model, data, d, runs, initial):
    """The tp2 x dp2 zero-2 run again, started by torchrun and as SLURM starts
    tasks: the mesh comes from the world each gives, so both must equal it."""
    case = "tp2 x dp2 ZeRO-2"
    stages, per_rank, schedule, dp, tp, zero = CASES[case]
    ref_run = runs[(case, tp)]
    with open(os.path.join(ref_run, "out", "metrics.jsonl")) as f:
        ref_losses = common.losses_of([json.loads(line) for line in f])
    ref_params = exported(torch, binary, ref_run, model)
    world = stages // per_rank * dp * tp
    failures = []
    for how in ("torchrun", "slurm"):
        if how == "torchrun" and subprocess.run(
                [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
                 "--no_python", "/bin/true"], capture_output=True).returncode != 0:
            # Debian's torch 1.13 ships a torchrun that cannot start even /bin/true (torchrun_test.cpp skips too).
            print(f"{case} started by torchrun: skipped, {sys.executable} -m torch.distributed.run cannot start "
                  f"/bin/true", flush=True)
            continue
        run = os.path.join(d, f"launch-{how}")
        write_config(run + ".yaml", run, model, data, stages, per_rank, schedule, dp, tp, zero)
        train = [binary, "train", "--config", run + ".yaml"]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if how == "torchrun":
            procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                       "--nproc_per_node", str(world), "--no_python", *train],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)]
        else:
            port = str(common.free_port())
            procs = [subprocess.Popen(train, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      env=dict(env, SLURM_PROCID=str(r), SLURM_NTASKS=str(world), SLURM_LOCALID=str(r),
                                               SLURM_JOB_ID="4242", SLURM_STEP_ID="0",
                                               SLURM_LAUNCH_NODE_IPADDR="127.0.0.1", MASTER_PORT=port))
                     for r in range(world)]
        try:
            outputs = [p.communicate(timeout=240)[0] for p in procs]  # a hang fails the test (TimeoutExpired)
        except subprocess.TimeoutExpired:
            for p in procs:  # torchrun's agent takes its workers with it
                p.kill()
                p.wait()
            raise
        if any(p.returncode != 0 for p in procs):
            failures.append(f"{how}: exit codes {[p.returncode for p in procs]}:\n" + "\n".join(outputs))
            continue
        with open(os.path.join(run, "out", "metrics.jsonl")) as f:
            losses = common.losses_of([json.loads(line) for line in f])
        problems, loss_diff, diff = common.compare_training(torch, losses, ref_losses,
                                                            exported(torch, binary, run, model), ref_params,
                                                            RTOL, ATOL, initial)
        print(f"{case} started by {how}: vs --nproc {world}: max |loss diff| {loss_diff:.2e}, max |param diff| "
              f"{diff:.2e}  {'ok' if not problems else 'MISMATCH'}", flush=True)
        failures += [f"{case} by {how}: {p}" for p in problems]
    return failures


def main():
    binary, zoo = sys.argv[1], sys.argv[2]
    try:
        import torch
    except ImportError as e:
        common.skip(f"no torch in {sys.executable}: {e}")
    torch.set_num_threads(1)
    model = os.path.join(zoo, "mlp.pt")
    failures = []
    with common.temp_dir("pf-tp-") as d:
        data = os.path.join(d, "data.pt")
        g = torch.Generator().manual_seed(3)
        torch.save({"inputs": torch.randn(64, 8, generator=g), "targets": torch.randn(64, 4, generator=g)}, data)
        initial = {k: v.detach() for k, v in torch.jit.load(model).state_dict().items()}
        runs = {}
        for name, (stages, per_rank, schedule, dp, tp, *zero) in CASES.items():
            results = []
            for t in (1, tp):
                run = os.path.join(d, f"{name.replace(' ', '_')}-tp{t}")
                write_config(run + ".yaml", run, model, data, stages, per_rank, schedule, dp, t, *zero)
                losses, states = train(binary, run, stages // per_rank * dp * t)
                results.append((losses, exported(torch, binary, run, model), states))
                runs[(name, t)] = run
            (l1, s1, st1), (lt, st, stt) = results
            problems, loss_diff, diff = common.compare_training(torch, lt, l1, st, s1, RTOL, ATOL, initial)
            problems += check_model_state(stt, st1, tp)
            print(f"{name:16s} vs tp1: max |loss diff| {loss_diff:.2e}, max |param diff| {diff:.2e}; parameter bytes "
                  f"per rank {[stt[r]['param_bytes'] for r in sorted(stt)]} (tp1: "
                  f"{[st1[r]['param_bytes'] for r in sorted(st1)]})  {'ok' if not problems else 'MISMATCH'}",
                  flush=True)
            failures += [f"{name}: {p}" for p in problems]

        # Step-3 checkpoints resume on another degree, as the straight run goes on.
        # With ZeRO: tp2's whole optimizer state onto tp1's pieces, and tp1's shard files onto tp2's.
        for case, source_tp, target_tp in (("pp2 x tp2 1F1B", 2, 1), ("pp2 x tp2 1F1B", 1, 2), ("tp4", 1, 4),
                                           ("tp2 x dp2 ZeRO-2", 2, 1), ("tp2 x dp2 ZeRO-2", 1, 2),
                                           ("pp2xtp2xdp2 ZeRO-3", 2, 1), ("pp2xtp2xdp2 ZeRO-3", 1, 2)):
            src = runs[(case, source_tp)]
            stages, per_rank, schedule, dp, _, *zero = CASES[case]
            with open(os.path.join(src, "out", "metrics.jsonl")) as f:
                straight = [json.loads(line)["loss"] for line in f if '"event":"train"' in line.replace(" ", "")]
            straight_params = exported(torch, binary, src, model)
            run = os.path.join(d, f"resume-{case.replace(' ', '_')}-tp{source_tp}-to-tp{target_tp}")
            os.makedirs(os.path.join(run, "ckpt"))
            shutil.copytree(os.path.join(src, "ckpt", "step_00000003"), os.path.join(run, "ckpt", "step_00000003"))
            with open(os.path.join(run, "ckpt", "latest"), "w") as f:
                f.write("step_00000003\n")
            write_config(run + ".yaml", run, model, data, stages, per_rank, schedule, dp, target_tp, *zero)
            losses, _ = train(binary, run, stages // per_rank * dp * target_tp)
            problems, loss_diff, diff = common.compare_training(
                torch, losses, straight[3:], exported(torch, binary, run, model), straight_params, RTOL, ATOL, initial)
            print(f"resume {case} tp{source_tp} -> tp{target_tp}: steps 4-6 max |loss diff| {loss_diff:.2e}, max |param diff| "
                  f"{diff:.2e}  {'ok' if not problems else 'MISMATCH'}", flush=True)
            failures += [f"resume tp{source_tp} -> tp{target_tp}: {p}" for p in problems]
        failures += check_other_launchers(torch, binary, model, data, d, runs, initial)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print(f"tensor parallel equals the unsplit pipeline on {len(CASES)} layouts (rtol {RTOL}), and resumes across "
          f"degrees")


if __name__ == "__main__":
    main()
