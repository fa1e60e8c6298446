#!/usr/bin/python3
"""Elastic resume: a checkpoint written by one layout resumes on another.

The zoo's `gpt` (embedding and head tied across the two ends of the pipeline,
no dropout) trains 20 steps on layout A with a checkpoint every 10 steps.
Layout B then resumes from A's step-10 checkpoint and trains to step 20. For
each change of layout (Note [Elastic resume] in train/rank_checkpoint.cpp):

  pipeline ranks 2 -> 4 and 4 -> 2, stages_per_rank 1 -> 2 (4 stages on 2
  ranks, ZBVZeroBubble), data parallel 1 -> 2 and 2 -> 1, another schedule
  (GPipe), another split of the same model (other cut points),

and for AdamW and SGD with momentum:
  - B's losses and final parameters equal 10 steps of plain PyTorch started
    from A's step-10 state, read with torch.load from the checkpoint's stage
    files (parameters, buffers and the optimizer state by FQN), within
    rtol 1e-5 (atol 1e-6 for SGD, 1e-5 for AdamW: below);
  - B's final parameters are within float tolerance (rtol 1e-4, atol 1e-5)
    of A's straight 20 steps.

`pipeforge inspect CKPT --format json` lists what torch.load finds in the
stage files (parameters with dtype and shape, optimizer state per FQN), and
the layout, without reading them (they are emptied first).

Then the refusals: resuming with another optimizer, and with another model
(a parameter of another shape; a parameter the checkpoint lacks), each
naming the first mismatch.

Usage: test_elastic_resume.py PIPEFORGE_BINARY ZOO_DIR [adamw|sgd]
"""
import json
import os
import shutil
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import interop_common as common  # noqa: E402

HALF, STEPS = 10, 20
MICROBATCHES, ROWS_PER_MB, ROWS, SEED = 4, 2, 48, 7
# B against plain PyTorch from A's state: rtol 1e-5, and an atol per
# optimizer. SGD agrees within 1e-6. AdamW's 10 steps come out up to 3.7e-6
# apart (losses 1.2e-7): LibTorch's AdamW and the stages' autograd against
# PyTorch's, not the resume, since the same resume on a layout that does the
# same arithmetic (pipeline ranks, schedule, cut points) equals A's straight
# run bit for bit; the equivalence tests from step 0 use atol 1e-5 too.
RTOL = 1e-5
ATOL = {"adamw": 1e-5, "sgd": 1e-6}
RTOL_A, ATOL_A = 1e-4, 1e-5        # B against A's straight run
OPTIMIZERS = {
    "adamw": ("{name: adamw, lr: 3.0e-3, weight_decay: 0.1}", dict(lr=3e-3, weight_decay=0.1)),
    "sgd": ("{name: sgd, lr: 0.05, momentum: 0.9}", dict(lr=0.05, momentum=0.9)),
}
# name -> (model section extras, schedule, stages_per_rank, data_parallel, ranks[, zero_stage])
LAYOUTS = {
    "pp2": ("num_stages: 2, policy: parameters", "1F1B", 1, 1, 2),
    "pp4": ("num_stages: 4, policy: parameters", "1F1B", 1, 1, 4),
    "pp2_v": ("num_stages: 4, policy: parameters", "ZBVZeroBubble", 2, 1, 2),
    "pp2_dp2": ("num_stages: 2, policy: parameters", "1F1B", 1, 2, 4),
    "pp2_gpipe": ("num_stages: 2, policy: parameters", "GPipe", 1, 1, 2),
    "pp2_cut": ("num_stages: 2, split_points: {ln_f: BEGINNING}", "1F1B", 1, 1, 2),
    "pp2_dp2_z1": ("num_stages: 2, policy: parameters", "1F1B", 1, 2, 4, 1),
}
# (A, B, what changes)
CHANGES = [
    ("pp2", "pp4", "pipeline ranks 2 -> 4"),
    ("pp4", "pp2", "pipeline ranks 4 -> 2"),
    ("pp2", "pp2_v", "stages_per_rank 1 -> 2, 1F1B -> ZBVZeroBubble"),
    ("pp2", "pp2_dp2", "data parallel 1 -> 2"),
    ("pp2_dp2", "pp2", "data parallel 2 -> 1"),
    ("pp2", "pp2_gpipe", "schedule 1F1B -> GPipe"),
    ("pp2", "pp2_cut", "another split (cut before ln_f)"),
    ("pp2_dp2", "pp2_dp2_z1", "zero_stage 0 -> 1 (optimizer state sharded)"),
    ("pp2_dp2_z1", "pp2", "zero_stage 1 -> 0, data parallel 2 -> 1"),
]


def make_data(torch, path: str) -> None:
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 64, (ROWS, 17), generator=g)
    torch.save({"inputs": tokens[:, :-1].contiguous(), "targets": tokens[:, 1:].contiguous()}, path)


def write_config(path: str, run: str, model_path: str, data_path: str, layout: str, optimizer: str,
                 loss: str = "cross_entropy", every: int = HALF) -> None:
    model, schedule, per_rank, dp, _, *zero = LAYOUTS[layout]
    with open(path, "w") as f:
        f.write(f"""model: {{path: {model_path}, {model}}}
pipeline: {{schedule: {schedule}, microbatches: {MICROBATCHES}, stages_per_rank: {per_rank}, data_parallel: {dp}, zero_stage: {zero[0] if zero else 0}}}
loss: {loss}
optimizer: {OPTIMIZERS[optimizer][0]}
lr_schedule: {{decay: constant, warmup_steps: 0}}
data: {{format: tensors, path: {data_path}, val_fraction: 0.0}}
training: {{steps: {STEPS}, global_batch_size: {ROWS_PER_MB * MICROBATCHES}, seed: {SEED}, eval_every: 0}}
checkpoint: {{dir: {run}/ckpt, every: {every}}}
distributed: {{timeout_s: 60}}
output: {{dir: {run}/out}}
""")


def train(binary: str, run: str, layout: str) -> None:
    common.run_pipeforge(binary, "train", "--config", run + ".yaml", "--nproc", str(LAYOUTS[layout][4]),
                         env={"OMP_NUM_THREADS": "1"})


def train_losses(run: str) -> list:
    with open(os.path.join(run, "out", "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return [r["loss"] for r in sorted((r for r in records if r["event"] == "train"), key=lambda r: r["step"])]


def exported_state(torch, binary: str, run: str, model_path: str) -> dict:
    out = os.path.join(run, "trained.pt")
    common.run_pipeforge(binary, "export", os.path.join(run, "ckpt"), "--model", model_path, "--out", out)
    return {k: v.detach() for k, v in torch.jit.load(out).state_dict().items()}


def read_checkpoint(torch, step_dir: str):
    """A checkpoint through plain PyTorch: every stage file with torch.load's defaults."""
    with open(os.path.join(step_dir, "meta.json")) as f:
        meta = json.load(f)
    tensors, states, names = {}, {}, set()
    for s in range(meta["num_stages"]):
        stage = torch.load(os.path.join(step_dir, f"stage_{s}.pt"))
        tensors.update(stage["parameters"])
        tensors.update(stage["buffers"])
        names.add(stage["optimizer"]["name"])
        states.update(stage["optimizer"]["state"])
        # Note [Sharded checkpoints]: each data-parallel rank's pieces, by FQN
        # and element range, put back together here.
        pieced = {}
        for k in range(stage.get("optimizer_shards", 0)):
            shard = torch.load(os.path.join(step_dir, f"stage_{s}.optim_shard_{k}.pt"))
            assert shard["shard"] == k and shard["shards"] == stage["optimizer_shards"], shard.keys()
            for name, (begin, end, numel) in shard["ranges"].items():
                whole = pieced.setdefault(name, {})
                for slot, piece in shard["optimizer"]["state"].get(name, {}).items():
                    if slot == "step":
                        whole["step"] = piece
                        continue
                    flat = whole.setdefault(slot, torch.full((numel,), float("nan"), dtype=piece.dtype))
                    flat[begin:end] = piece
        for name, st in pieced.items():
            for slot, t in st.items():
                if slot != "step":
                    assert not torch.isnan(t).any(), f"{name} {slot}: a piece is missing"
                    st[slot] = t.reshape(stage["parameters"][name].shape)
        states.update(pieced)
    aliases = {}
    for group in meta["tied"]:
        for name in group:
            aliases[name] = group
    return meta, tensors, names, states, aliases


def by_alias(table: dict, aliases: dict, name: str):
    for n in aliases.get(name, [name]):
        if n in table:
            return table[n]
    return None


def train_from_checkpoint(torch, model_path: str, data_path: str, step_dir: str, optimizer: str):
    """HALF steps of eager PyTorch from the state a checkpoint holds."""
    meta, tensors, names, states, aliases = read_checkpoint(torch, step_dir)
    assert names == {optimizer}, f"the checkpoint holds {names} state, expected {optimizer}"
    model = torch.jit.load(model_path)
    model.train()
    with torch.no_grad():
        for name, t in model.state_dict().items():
            value = by_alias(tensors, aliases, name)
            assert value is not None, f"{name} is not in {step_dir}"
            t.copy_(value)
    kwargs = OPTIMIZERS[optimizer][1]
    if optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), foreach=False, **kwargs)
    else:
        opt = torch.optim.SGD(model.parameters(), foreach=False, **kwargs)
    for name, p in model.named_parameters():
        st = by_alias(states, aliases, name)
        assert st is not None, f"no optimizer state for {name}"
        if optimizer == "adamw":
            opt.state[p] = {"step": torch.tensor(float(st["step"])), "exp_avg": st["exp_avg"].clone(),
                            "exp_avg_sq": st["exp_avg_sq"].clone()}
        else:
            opt.state[p] = {"momentum_buffer": st["momentum_buffer"].clone()}
    data = torch.load(data_path)
    losses = common.train_token_steps(torch, model, opt, data["inputs"], data["targets"], SEED,
                                      range(meta["step"], meta["step"] + HALF), MICROBATCHES, ROWS_PER_MB)
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}, tensors, aliases


def resume_on(binary: str, d: str, a_run: str, b_layout: str, name: str, model_path: str, data_path: str,
              optimizer: str) -> str:
    """B: a fresh run folder whose checkpoint.dir holds A's step-10 checkpoint."""
    run = os.path.join(d, name)
    ckpt = os.path.join(run, "ckpt")
    os.makedirs(ckpt)
    shutil.copytree(os.path.join(a_run, "ckpt", f"step_{HALF:08d}"), os.path.join(ckpt, f"step_{HALF:08d}"))
    with open(os.path.join(ckpt, "latest"), "w") as f:
        f.write(f"step_{HALF:08d}\n")
    write_config(run + ".yaml", run, model_path, data_path, b_layout, optimizer)
    train(binary, run, b_layout)
    return run


def check_layout_changes(torch, binary: str, d: str, model_path: str, data_path: str, optimizer: str) -> list:
    failures = []
    a_runs = {}
    for a in sorted({a for a, _, _ in CHANGES}):
        run = os.path.join(d, f"{optimizer}-A-{a}")
        write_config(run + ".yaml", run, model_path, data_path, a, optimizer)
        train(binary, run, a)
        a_runs[a] = (run, exported_state(torch, binary, run, model_path))
    for a, b, what in CHANGES:
        a_run, a_state = a_runs[a]
        b_run = resume_on(binary, d, a_run, b, f"{optimizer}-B-{a}-to-{b}", model_path, data_path, optimizer)
        b_losses = train_losses(b_run)
        b_state = exported_state(torch, binary, b_run, model_path)
        ref_losses, ref_state, start, aliases = train_from_checkpoint(
            torch, model_path, data_path, os.path.join(a_run, "ckpt", f"step_{HALF:08d}"), optimizer)
        start_state = {k: by_alias(start, aliases, k) for k in ref_state}
        problems, loss_diff, diff = common.compare_training(torch, b_losses, ref_losses, b_state, ref_state, RTOL,
                                                            ATOL[optimizer], start_state)
        if a_run.endswith("pp2") and b.endswith("_cut"):
            # Another split indeed: stage 0 holds other names than A's.
            names = [sorted(json.load(open(os.path.join(r, "ckpt", f"step_{n:08d}", "stage_0.json")))["parameters"])
                     for r, n in ((a_run, HALF), (b_run, STEPS))]
            if names[0] == names[1]:
                failures.append(f"{what}: the split is the same as A's, stage 0 holds {names[0]}")
        a_problems, _, a_diff = common.compare_training(torch, train_losses(a_run)[HALF:], b_losses, b_state,
                                                        a_state, RTOL_A, ATOL_A)
        print(f"{optimizer:5s} {what:46s} vs PyTorch from A's step {HALF}: max |loss diff| {loss_diff:.2e}, "
              f"max |param diff| {diff:.2e}; vs {STEPS} steps on A: max |param diff| {a_diff:.2e}  "
              f"{'ok' if not problems and not a_problems else 'MISMATCH'}", flush=True)
        failures += [f"{optimizer} {what}: {p}" for p in problems]
        failures += [f"{optimizer} {what} (against {STEPS} steps on A): {p}" for p in a_problems]
    return failures


def save_mlp(torch, path: str, width: int, head: bool = False) -> None:
    """fc1 (4 -> width), then fc2 (width -> 2), or `head` in fc2's place, as TorchScript."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(4, width)
            self.fc2 = torch.nn.Linear(width, 2)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    class HeadNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(4, width)
            self.head = torch.nn.Linear(width, 2)

        def forward(self, x):
            return self.head(torch.relu(self.fc1(x)))

    torch.manual_seed(0)
    torch.jit.save(torch.jit.script(HeadNet() if head else Net()), path)


def check_inspect(torch, binary: str, d: str) -> list:
    """`pipeforge inspect CKPT --format json` against torch.load of the same files; it reads no tensor,
    so it still works with every stage file emptied."""
    problems = []
    a_run = os.path.join(d, "adamw-A-pp2_dp2")
    copy = os.path.join(d, "inspect-ckpt")
    shutil.copytree(os.path.join(a_run, "ckpt"), copy)
    step_dir = os.path.join(copy, f"step_{STEPS:08d}")
    expected = []
    for s in range(2):
        stage = torch.load(os.path.join(step_dir, f"stage_{s}.pt"))
        dtype = {torch.float32: "float32"}
        expected.append(({k: f"{dtype[v.dtype]}{list(v.shape)}" for k, v in stage["parameters"].items()},
                         {k: sorted(v) for k, v in stage["optimizer"]["state"].items()}))
        open(os.path.join(step_dir, f"stage_{s}.pt"), "w").close()
    view = json.loads(common.run_pipeforge(binary, "inspect", copy, "--format", "json"))
    if (view["step"], view["num_stages"], view["world_size"], view["layout"]) != (
            STEPS, 2, 4, {"pipeline_ranks": 2, "data_parallel": 2, "stages_per_rank": 1,
                      "zero_stage": 0}):
        problems.append(f"inspect: step/layout {view['step']} {view['num_stages']} {view['world_size']} {view['layout']}")
    for s, (params, slots) in enumerate(expected):
        got = view["stages"][s]
        if got["parameters"] != params:
            problems.append(f"inspect stage {s}: parameters {got['parameters']} vs torch.load {params}")
        if {k: sorted(v) for k, v in got["optimizer"]["state"].items()} != slots or got["optimizer"]["name"] != "adamw":
            problems.append(f"inspect stage {s}: optimizer state {got['optimizer']} vs torch.load {slots}")
    text = common.run_pipeforge(binary, "inspect", copy, "--stage", "1")
    if "layout: 2 stages, 2 pipeline ranks x 2 data-parallel (world 4), 1 stage per rank" not in text or \
            "stage 0:" in text or "stage 1:" not in text:
        problems.append(f"inspect text:\n{text}")
    print(f"inspect CKPT: step {view['step']}, layout {view['layout']}, "
          f"{sum(len(p) for p, _ in expected)} parameters as torch.load reads them, with the stage files emptied")
    return problems


def check_refusals(torch, binary: str, d: str, model_path: str, data_path: str) -> list:
    problems = []
    # Another optimizer than the checkpoint's.
    a_run = os.path.join(d, "adamw-A-pp2")
    run = os.path.join(d, "refuse-optimizer")
    os.makedirs(os.path.join(run, "ckpt"))
    shutil.copytree(os.path.join(a_run, "ckpt", f"step_{HALF:08d}"), os.path.join(run, "ckpt", f"step_{HALF:08d}"))
    with open(os.path.join(run, "ckpt", "latest"), "w") as f:
        f.write(f"step_{HALF:08d}\n")
    write_config(run + ".yaml", run, model_path, data_path, "pp4", "sgd")
    problems += common.expect_refusal(binary, run + ".yaml", "another optimizer",
                                      ["holds adamw state but optimizer.name is sgd", "resume with optimizer.name: adamw",
                                       "checkpoint.resume: false"], 4)

    # Another model: an MLP trained 2 steps, resumed with other shapes, then with another parameter.
    mlp_data = os.path.join(d, "mlp.pt")
    g = torch.Generator().manual_seed(5)
    torch.save({"inputs": torch.randn(16, 4, generator=g), "targets": torch.randn(16, 2, generator=g)}, mlp_data)
    mlp_run = os.path.join(d, "mlp")

    def mlp_config(model: str, second: str, steps: int) -> str:
        with open(mlp_run + ".yaml", "w") as f:
            f.write(f"""model: {{path: {os.path.join(d, model)}, num_stages: 2, split_points: {{{second}: BEGINNING}}}}
pipeline: {{schedule: 1F1B, microbatches: 2}}
loss: mse
optimizer: {{name: adamw, lr: 1.0e-3}}
data: {{format: tensors, path: {mlp_data}, val_fraction: 0.0}}
training: {{steps: {steps}, global_batch_size: 4, seed: 1, eval_every: 0}}
checkpoint: {{dir: {mlp_run}/ckpt}}
distributed: {{timeout_s: 60}}
output: {{dir: {mlp_run}/out}}
""")
        return mlp_run + ".yaml"

    save_mlp(torch, os.path.join(d, "mlp_8.pt"), 8)
    save_mlp(torch, os.path.join(d, "mlp_16.pt"), 16)
    save_mlp(torch, os.path.join(d, "mlp_head.pt"), 8, head=True)
    common.run_pipeforge(binary, "train", "--config", mlp_config("mlp_8.pt", "fc2", 2), "--nproc", "2")
    problems += common.expect_refusal(binary, mlp_config("mlp_16.pt", "fc2", 4), "a parameter of another shape",
                                      ["'fc1.weight' is float32[16, 4] in this split's model but float32[8, 4] in checkpoint",
                                       "written for another model"])
    problems += common.expect_refusal(binary, mlp_config("mlp_head.pt", "head", 4), "a parameter the checkpoint lacks",
                                      ["does not hold parameter 'head.weight' (stage 1 of this split)",
                                       "written for another model"])
    return problems


def main() -> None:
    binary, zoo = sys.argv[1], sys.argv[2]
    optimizers = sys.argv[3:] or list(OPTIMIZERS)
    try:
        import torch
    except ImportError as e:
        common.skip(f"no torch in {sys.executable}: {e}")
    torch.set_num_threads(1)
    model_path = os.path.join(zoo, "gpt.pt")
    failures = []
    with common.temp_dir("pf-elastic-") as d:
        data_path = os.path.join(d, "data.pt")
        make_data(torch, data_path)
        for optimizer in optimizers:
            failures += check_layout_changes(torch, binary, d, model_path, data_path, optimizer)
        if "adamw" in optimizers:
            failures += check_inspect(torch, binary, d)
            failures += check_refusals(torch, binary, d, model_path, data_path)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print(f"every layout change resumes as plain PyTorch from the checkpoint (rtol {RTOL}, atol {ATOL}) and stays within "
          f"rtol {RTOL_A} of the straight run")


if __name__ == "__main__":
    main()
