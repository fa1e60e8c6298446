#!/usr/bin/python3
"""pipeline.zero_stage 1, 2 and 3 train exactly as zero_stage 0 (issue 42).

The zoo's `gpt` (embedding and head tied across the pipeline's two ends)
trains 6 steps at pipeline 2 x data parallel 2 on 4 Gloo ranks, once with
every stage's optimizer state whole on every replica (zero_stage 0, which
the other tests check against plain PyTorch), once with it sharded
(zero_stage 1: Note [Sharded optimizer]), once with the gradients
sharded too (zero_stage 2: Note [Sharded gradients]) and once with the
parameters as well, gathered at UNSHARD and released at RESHARD (zero_stage
3: Note [Sharded parameters]). For each case:
  - the per-step losses and the final parameters (`pipeforge export`) agree
    within rtol 1e-6 (the pieces step element by element, as the whole
    tensors do: in practice the runs are bit for bit equal), and zero 2 and 3
    with clipping within AdamW's 1e-5 (RTOL_CLIP below);
  - every rank's `model_state` record keeps, per parameter, 4 bytes of
    parameters (4 / d with zero 3), 4 of gradients (4 / d with zero 2 and
    3) and 8 / d of AdamW state (4 / d for SGD's momentum), within 2% plus
    the padding of its pieces.
The cases: 1F1B; Interleaved1F1B, ZBVZeroBubble (split backward) and
DualPipeV with 2 stages per rank; gradient clipping with no-decay groups and
fused AdamW (LibTorch 2.4+); fp16 with a loss scale high enough that the
first step overflows and is skipped (LibTorch 2.5+); bf16 on DualPipeV; SGD
with momentum and full activation checkpointing; zero 3 with one stage
unsharded at a time (pipeline.max_active_stages: 1). Then a checkpoint of the
zero-1 run resumes, equal to the straight run, on zero 0, on 4 stages (ZBV),
on zero 2, on zero 2 with 4 replicas of one stage (the pieces cut for d = 2
assembled into d = 4) and on zero 3 with 4 replicas; and a checkpoint of the
zero-3 run resumes on zero 0, and on zero 3 with 4 stages (ZBV).

Usage: test_zero_matches_unsharded.py PIPEFORGE_BINARY ZOO_DIR
"""
import json
import os
import shutil
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import interop_common as common  # noqa: E402

STEPS, MICROBATCHES, ROWS_PER_MB, SEED = 6, 4, 2, 11
RTOL, ATOL = 1e-6, 1e-7
# With clipping, zero 2 sums the global norm's squares piece by piece, in
# another order than zero 0 does: the norm, and so the clip coefficient,
# differ in the last bits, which AdamW's normalised step turns into up to
# ~1e-6 on small weights. AdamW's tolerance elsewhere in the tests, then.
RTOL_CLIP, ATOL_CLIP = 1e-5, 1e-5
ADAMW = "{name: adamw, lr: 3.0e-3, weight_decay: 0.1}"
# name -> (stages, stages_per_rank, schedule, optimizer, extra pipeline keys, extra training keys[, zero stages])
CASES = {
    "1F1B": (2, 1, "1F1B", ADAMW, "", ""),
    "Interleaved1F1B": (4, 2, "Interleaved1F1B", ADAMW, "", ""),
    "ZBVZeroBubble": (4, 2, "ZBVZeroBubble", ADAMW, "", ""),
    "DualPipeV": (4, 2, "DualPipeV", ADAMW, "", ""),
    "clip+no_decay+fused": (2, 1, "1F1B", "{name: adamw, lr: 3.0e-3, weight_decay: 0.1, clip_grad_norm: 0.5,"
                            " fused: true, no_decay: ['*.bias', '*ln*']}", "", ""),
    "fp16 with overflows": (2, 1, "1F1B", ADAMW, "", ", precision: fp16, loss_scale: {initial: 1048576}"),
    "bf16": (4, 2, "DualPipeV", ADAMW, "", ", precision: bf16"),
    "sgd+checkpointing": (4, 2, "ZBVZeroBubble", "{name: sgd, lr: 0.05, momentum: 0.9}",
                          ", activation_checkpointing: full", ""),
    # One stage unsharded at a time: the V layout's two stages per rank
    # alternate, so RESHARD frees a stage between its forwards and its
    # backwards, and UNSHARD gathers it again (zero 3 only).
    "max_active_stages 1": (4, 2, "ZBVZeroBubble", ADAMW, ", max_active_stages: 1", "", (3,)),
}


def write_config(path, run, model, data, stages, per_rank, schedule, optimizer, pipeline_extra, training_extra,
                 zero, dp=2, steps=STEPS, every=3):
    with open(path, "w") as f:
        f.write(f"""model: {{path: {model}, num_stages: {stages}, policy: parameters}}
pipeline: {{schedule: {schedule}, microbatches: {MICROBATCHES}, stages_per_rank: {per_rank}, data_parallel: {dp}, zero_stage: {zero}{pipeline_extra}}}
loss: cross_entropy
optimizer: {optimizer}
lr_schedule: {{decay: constant, warmup_steps: 0}}
data: {{format: tensors, path: {data}, val_fraction: 0.0}}
training: {{steps: {steps}, global_batch_size: {2 * ROWS_PER_MB * MICROBATCHES}, seed: {SEED}, eval_every: 0{training_extra}}}
checkpoint: {{dir: {run}/ckpt, every: {every}}}
distributed: {{timeout_s: 60}}
output: {{dir: {run}/out}}
""")


def train(binary, run):
    records = common.train_records(binary, run + ".yaml", 4, os.path.join(run, "out"))
    overflows = sum(r["event"] == "overflow" for r in records)
    return common.losses_of(records), [r for r in records if r["event"] == "model_state"], overflows


def exported(torch, binary, run, model):
    return common.exported_state(torch, binary, os.path.join(run, "ckpt"), model, os.path.join(run, "trained.pt"))


def check_model_state(records, optimizer, zero):
    """At d = 2: parameters 4 (zero 3: 4 / 2), gradients 4 (zero 2, 3: 4 / 2), optimizer state 8 / 2 (SGD momentum
    4 / 2) bytes per parameter."""
    problems = []
    state_bytes = 4 if "sgd" in optimizer else 8
    for r in records:
        n = r["parameters"]
        expect = {"param_bytes": 4 * n / (2 if zero >= 3 else 1), "grad_bytes": 4 * n / (2 if zero >= 2 else 1), "optimizer_bytes": state_bytes * n / 2}
        for key, value in expect.items():
            # Padding: a rank's piece of a tensor is at most one element longer than n / d.
            if abs(r[key] - value) > 0.02 * value + state_bytes * 64:
                problems.append(f"rank {r['rank']}: {key} {r[key]}, expected {value:.0f} (zero {zero}, d 2)")
    return problems


def main():
    binary, zoo = sys.argv[1], sys.argv[2]
    try:
        import torch
    except ImportError as e:
        common.skip(f"no torch in {sys.executable}: {e}")
    torch.set_num_threads(1)
    model = os.path.join(zoo, "gpt.pt")
    failures = []
    with common.temp_dir("pf-zero-") as d:
        data = os.path.join(d, "data.pt")
        g = torch.Generator().manual_seed(3)
        tokens = torch.randint(0, 64, (64, 17), generator=g)
        torch.save({"inputs": tokens[:, :-1].contiguous(), "targets": tokens[:, 1:].contiguous()}, data)
        initial = {k: v.detach() for k, v in torch.jit.load(model).state_dict().items()}
        runs = {}
        for name, case in CASES.items():
            # The build's LibTorch is the Python's torch (the venv's, or Debian's 1.13 for the system build).
            version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
            if "fused: true" in case[3] and version < (2, 4):
                print(f"{name}: without fused (fused AdamW needs LibTorch 2.4)")
                case = (*case[:3], case[3].replace(" fused: true,", ""), *case[4:])
            if "fp16" in case[5] and version < (2, 5):
                print(f"{name}: skipped (fp16 autocast on the CPU needs LibTorch 2.5)")
                continue
            results = []
            zeros = case[6] if len(case) > 6 else (1, 2, 3)
            case = case[:6]
            for zero in (0, *zeros):
                run = os.path.join(d, f"{name.replace('+', '_').replace(' ', '_')}-z{zero}")
                write_config(run + ".yaml", run, model, data, *case, zero)
                losses, states, overflows = train(binary, run)
                results.append((losses, exported(torch, binary, run, model), states, overflows))
                runs[(name, zero)] = run
            l0, s0, _, over0 = results[0]
            for zero, (l1, s1, states1, over1) in zip(zeros, results[1:]):
                clipped = zero >= 2 and "clip_grad_norm" in case[3]
                problems, loss_diff, diff = common.compare_training(
                    torch, l1, l0, s1, s0, RTOL_CLIP if clipped else RTOL, ATOL_CLIP if clipped else ATOL, initial)
                problems += check_model_state(states1, case[3], zero)
                if len(states1) != 4:
                    problems.append(f"{len(states1)} model_state records for 4 ranks")
                if over0 != over1:
                    problems.append(f"{over1} overflow steps for zero 0's {over0}")
                if name == "fp16 with overflows" and not 0 < over1 < STEPS:
                    problems.append(f"{over1} of {STEPS} steps overflowed: the case must skip some and update in others")
                per_param = sorted({round(r["bytes_per_parameter"], 2) for r in states1})
                print(f"{name:22s} zero {zero} vs zero 0: max |loss diff| {loss_diff:.2e}, max |param diff| {diff:.2e}; "
                      f"bytes per parameter {per_param}; {over1} overflow steps  {'ok' if not problems else 'MISMATCH'}",
                      flush=True)
                failures += [f"{name} zero {zero}: {p}" for p in problems]

        # Zero 3's checkpoint: the stage files hold no parameter, and the
        # two shard files hold pieces that make up each one exactly.
        z3 = os.path.join(runs[("1F1B", 3)], "ckpt", "step_00000003")
        for s in range(2):
            stage_file = torch.load(os.path.join(z3, f"stage_{s}.pt"), weights_only=False)
            shards = [torch.load(os.path.join(z3, f"stage_{s}.optim_shard_{k}.pt"), weights_only=True) for k in range(2)]
            if stage_file["parameters"] or stage_file.get("parameter_shards") != 2:
                failures.append(f"zero 3 checkpoint stage {s}: the stage file holds {len(stage_file['parameters'])} "
                                f"parameters, parameter_shards {stage_file.get('parameter_shards')}")
            for name, shape in shards[0]["shapes"].items():
                pieces = [sh["parameters"][name] for sh in shards]
                if sum(p.numel() for p in pieces) != torch.Size(shape).numel() or max(p.numel() for p in pieces) * 2 > \
                        torch.Size(shape).numel() + 2:
                    failures.append(f"zero 3 checkpoint stage {s}: '{name}' {shape} is in pieces of "
                                    f"{[p.numel() for p in pieces]}")
        print(f"zero 3 checkpoint: stage files without parameters, pieces in 2 shard files  "
              f"{'ok' if not failures else 'MISMATCH'}", flush=True)

        # The sharded runs' step-3 checkpoints resume on other zero stages,
        # layouts and data-parallel sizes, as the straight run goes on.
        straight = {}
        for zero in (1, 3):
            a_run = runs[("1F1B", zero)]
            with open(os.path.join(a_run, "out", "metrics.jsonl")) as f:
                losses = [json.loads(line)["loss"] for line in f if '"event":"train"' in line.replace(" ", "")]
            straight[zero] = (a_run, exported(torch, binary, a_run, model), losses)
        for source, tag, label, stages, per_rank, schedule, zero, dp in (
                (1, "to-z0", "zero 1 -> 0", 2, 1, "1F1B", 0, 2),
                (1, "to-zbv", "zero 1 -> 1, 4 stages (ZBV)", 4, 2, "ZBVZeroBubble", 1, 2),
                (1, "to-z2", "zero 1 -> 2", 2, 1, "1F1B", 2, 2),
                (1, "to-dp4", "zero 1, d 2 -> zero 2, d 4", 1, 1, "1F1B", 2, 4),
                (1, "to-z3-dp4", "zero 1, d 2 -> zero 3, d 4", 1, 1, "1F1B", 3, 4),
                (3, "z3-to-z0", "zero 3 -> 0", 2, 1, "1F1B", 0, 2),
                (3, "z3-to-zbv", "zero 3 -> 3, 4 stages (ZBV)", 4, 2, "ZBVZeroBubble", 3, 2)):
            a_run, a_state, a_losses = straight[source]
            run = os.path.join(d, "resume-" + tag)
            os.makedirs(os.path.join(run, "ckpt"))
            shutil.copytree(os.path.join(a_run, "ckpt", "step_00000003"), os.path.join(run, "ckpt", "step_00000003"))
            with open(os.path.join(run, "ckpt", "latest"), "w") as f:
                f.write("step_00000003\n")
            write_config(run + ".yaml", run, model, data, stages, per_rank, schedule, ADAMW, "", "", zero, dp)
            losses, _, _ = train(binary, run)
            problems, loss_diff, diff = common.compare_training(torch, losses, a_losses[3:], exported(torch, binary, run, model),
                                                                a_state, 1e-5, 1e-6)
            print(f"resume {label:26s} vs the straight sharded run: max |loss diff| {loss_diff:.2e}, "
                  f"max |param diff| {diff:.2e}  {'ok' if not problems else 'MISMATCH'}", flush=True)
            failures += [f"resume {label}: {p}" for p in problems]
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("zero_stage 1, 2 and 3 train as zero_stage 0 on every case, keep 1/d of what they shard, and resume across "
          "zero stages")


if __name__ == "__main__":
    main()
