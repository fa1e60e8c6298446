#!/usr/bin/python3
"""constant_inputs: a model whose forward takes non-tensor arguments splits and
trains like single-process PyTorch calling it with those values (issue "any
inputs"; Note [Constant inputs] in stage/constant_inputs.h).

The model is TorchScript `forward(self, x, scale: float, use_bias: bool = True)`.

(a) Split. `pipeforge split` with constant_inputs {scale: 2.0} writes stages
    that take only x; pipe.json lists inputs [x] and records constant_inputs
    {scale: 2.0, use_bias: true} (use_bias keeps its default), and `pipeforge
    inspect` shows them; example_inputs need one entry, for x. The stages, loaded with torch.jit.load and chained as
    pipe.json says, equal model(x, 2.0) within rtol 1e-6, atol 1e-7 (the same
    float32 ops in the same order) and differ from model(x, 1.0); a second
    split with {scale: 0.5, use_bias: false} equals model(x, 0.5, False).
(b) Train. `pipeforge train --nproc 2` (2 stages, 1F1B, 2 microbatches, SGD,
    mse, STEPS steps) with model.constant_inputs {scale: 2.0}, exported with
    `pipeforge export`, against one PyTorch process training model(x, scale=2.0)
    on the same rows (interop_common.batch_rows), each microbatch's loss divided
    by their number. Losses and final parameters agree within rtol 1e-4,
    atol 1e-5 (float32 along different but equivalent paths; the measured
    differences are printed).
(c) Refusals (exit 1, the message naming the problem and the fix): an unknown
    name, a value of the wrong type, a tensor argument, a non-tensor argument
    without default and without a value (train), and constant_inputs for a
    torch.export .pt2 (split).

Usage: test_constant_inputs_match_pytorch.py PIPEFORGE_BINARY
"""
import json
import os
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import interop_common as common  # noqa: E402

STEPS = 4
MICROBATCHES = 2
BATCH = 8
SEED = 11
LR = 0.1
RTOL, ATOL = 1e-4, 1e-5
SPLIT_RTOL, SPLIT_ATOL = 1e-6, 1e-7
F, H, O, ROWS = 5, 8, 3, 32


def model_class(torch):
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(F, H)
            self.fc2 = torch.nn.Linear(H, O)

        def forward(self, x, scale: float, use_bias: bool = True):
            h = torch.tanh(self.fc1(x)) * scale
            if use_bias:
                h = h + 0.5
            return self.fc2(h)

    return Scaled


def chain(torch, stage_dir: str, manifest: dict, inputs: list):
    outputs = []
    for stage in manifest["stages"]:
        module = torch.jit.load(os.path.join(stage_dir, stage["file"]))
        args = [inputs[s["index"]] if s["from"] == "input" else outputs[s["stage"]][s["index"]] for s in stage["inputs"]]
        outputs.append(module(*args))
    return [inputs[o["index"]] if o["from"] == "input" else outputs[o["stage"]][o["index"]] for o in manifest["outputs"]]


def check_split(torch, binary: str, d: str, model_path: str) -> list:
    problems = []
    model = torch.jit.load(model_path)
    x = torch.randn(6, F, generator=torch.Generator().manual_seed(2))
    cases = [("{scale: 2.0}", (2.0, True), {"scale": 2.0, "use_bias": True}),
             ("{scale: 0.5, use_bias: false}", (0.5, False), {"scale": 0.5, "use_bias": False})]
    for i, (constants, args, recorded) in enumerate(cases):
        spec, out = os.path.join(d, f"spec{i}.yaml"), os.path.join(d, f"split{i}")
        with open(spec, "w") as f:
            f.write(f"split_points: {{fc2: BEGINNING}}\nexample_inputs: [{{shape: [6, {F}]}}]\n"
                    f"constant_inputs: {constants}\n")
        common.run_pipeforge(binary, "split", model_path, "--spec", spec, "--out", out)
        with open(os.path.join(out, "pipe.json")) as f:
            manifest = json.load(f)
        if manifest["inputs"] != ["x"] or manifest.get("constant_inputs") != recorded:
            problems.append(f"split {constants}: pipe.json inputs {manifest['inputs']}, constant_inputs "
                            f"{manifest.get('constant_inputs')}; expected [x] and {recorded}")
        for stage in manifest["stages"]:
            names = [a.name for a in torch.jit.load(os.path.join(out, stage["file"])).forward.schema.arguments[1:]]
            if "scale" in names or "use_bias" in names:
                problems.append(f"split {constants}: {stage['file']} still takes {names}")
        with torch.no_grad():
            got = chain(torch, out, manifest, [x])[0]
            want, other = model(x, *args), model(x, 1.0, args[1])
        diff = (got - want).abs().max().item()
        print(f"split {constants:30s} max |stages - model(x, {args[0]}, {args[1]})| {diff:.2e}, "
              f"vs scale 1.0 {(got - other).abs().max().item():.2e}", flush=True)
        if not torch.allclose(got, want, rtol=SPLIT_RTOL, atol=SPLIT_ATOL):
            problems.append(f"split {constants}: stages differ from model(x, {args}) by {diff:.3g}")
        if torch.allclose(got, other, rtol=1e-3, atol=1e-3):
            problems.append(f"split {constants}: stages equal model(x, 1.0): the constant did not reach them")
        if i == 0:
            shown = common.run_pipeforge(binary, "inspect", out)
            if "constant_inputs, baked into the stages: scale = 2.0, use_bias = true" not in shown:
                problems.append(f"inspect does not show the constants:\n{shown}")
    return problems


def train_pytorch(torch, model_path: str, data_path: str):
    import torch.nn.functional as fn
    model = torch.jit.load(model_path)
    model.train()
    data = torch.load(data_path)
    x_all, y_all = data["inputs"], data["targets"]
    opt = torch.optim.SGD(model.parameters(), lr=LR, foreach=False)
    losses = []
    for step in range(STEPS):
        rows = torch.tensor(common.batch_rows(SEED, ROWS, step, BATCH))
        x, y = x_all.index_select(0, rows), y_all.index_select(0, rows)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for x_mb, y_mb in zip(torch.tensor_split(x, MICROBATCHES), torch.tensor_split(y, MICROBATCHES)):
            loss = fn.mse_loss(model(x_mb, scale=2.0), y_mb)
            (loss / MICROBATCHES).backward()
            total += loss.item() / MICROBATCHES
        opt.step()
        losses.append(total)
    return losses, {k: v.detach().clone() for k, v in model.named_parameters()}


def config_text(run: str, model_path: str, data_path: str, constants: str) -> str:
    constant_line = f", constant_inputs: {constants}" if constants else ""
    return f"""model: {{path: {model_path}, num_stages: 2, policy: parameters{constant_line}}}
pipeline: {{schedule: 1F1B, microbatches: {MICROBATCHES}}}
loss: mse
optimizer: {{name: sgd, lr: {LR}}}
lr_schedule: {{decay: constant, warmup_steps: 0}}
data: {{format: tensors, path: {data_path}, val_fraction: 0.0}}
training: {{steps: {STEPS}, global_batch_size: {BATCH}, seed: {SEED}, eval_every: 0}}
checkpoint: {{dir: {run}/ckpt}}
distributed: {{timeout_s: 60}}
output: {{dir: {run}/out}}
"""


def train_pipeforge(torch, binary: str, run: str, model_path: str, data_path: str):
    with open(run + ".yaml", "w") as f:
        f.write(config_text(run, model_path, data_path, "{scale: 2.0}"))
    common.run_pipeforge(binary, "train", "--config", run + ".yaml", "--nproc", "2", env={"OMP_NUM_THREADS": "1"})
    trained = os.path.join(run, "trained.pt")
    common.run_pipeforge(binary, "export", os.path.join(run, "ckpt"), "--model", model_path, "--out", trained)
    with open(os.path.join(run, "out", "metrics.jsonl")) as f:
        records = sorted((json.loads(line) for line in f), key=lambda r: r.get("step", 0))
    losses = [r["loss"] for r in records if r["event"] == "train"]
    state = {k: v.detach() for k, v in torch.jit.load(trained).named_parameters()}
    return losses, state


def refusals(torch, binary: str, d: str, model_path: str, data_path: str) -> list:
    arguments = "forward's non-tensor arguments are scale (float), use_bias (bool = True)"
    cases = [
        ("an unknown name", "{scale: 2.0, sclae: 1.0}",
         ["constant_inputs.sclae: forward has no argument 'sclae'", arguments]),
        ("a value of the wrong type", "{scale: abc}", ["constant_inputs.scale: forward takes a float, got 'abc'"]),
        ("a list for a bool", "{scale: 2.0, use_bias: [1, 2]}",
         ["constant_inputs.use_bias: forward takes a bool, got [1, 2]"]),
        ("a tensor argument", "{scale: 2.0, x: 1.0}",
         ["constant_inputs.x: 'x' is a Tensor argument of forward, which the data gives", arguments]),
        ("no value for scale", None,
         ["forward's argument 'scale' is a float with no default", "constant_inputs: {scale: ...}"]),
    ]
    problems = []
    for label, constants, fragments in cases:
        run = os.path.join(d, "refuse-" + label.replace(" ", "_"))
        with open(run + ".yaml", "w") as f:
            f.write(config_text(run, model_path, data_path, constants))
        problems += common.expect_refusal(binary, run + ".yaml", label, fragments)

    # A torch.export program fixed scale when it was exported: constant_inputs is refused for it.
    if hasattr(torch, "export") and hasattr(torch.export, "save"):
        pt2 = os.path.join(d, "scaled.pt2")
        torch.export.save(torch.export.export(model_class(torch)(), (torch.randn(2, F), 2.0)), pt2)
        spec = os.path.join(d, "pt2_spec.yaml")
        with open(spec, "w") as f:
            f.write("split_points: {fc2: BEGINNING}\nconstant_inputs: {scale: 3.0}\n")
        r = subprocess.run([binary, "split", pt2, "--spec", spec, "--out", os.path.join(d, "pt2_split")],
                           capture_output=True, text=True)
        text = r.stdout + r.stderr
        fragment = "is a torch.export program, whose non-tensor arguments were fixed when it was exported"
        if r.returncode != 1 or fragment not in text:
            problems.append(f"refusal 'constant_inputs for a .pt2': exit {r.returncode}:\n{text}")
        else:
            print(f"refused constant_inputs for a .pt2: {text.strip().splitlines()[-1][:200]}")
    return problems


def main() -> None:
    binary = sys.argv[1]
    try:
        import torch
    except ImportError as e:
        common.skip(f"no torch in {sys.executable}: {e}")
    torch.set_num_threads(1)
    failures = []
    with common.temp_dir("pf-constant-inputs-") as d:
        model_path = os.path.join(d, "scaled.pt")
        torch.manual_seed(3)
        torch.jit.script(model_class(torch)()).save(model_path)
        g = torch.Generator().manual_seed(5)
        data_path = os.path.join(d, "data.pt")
        torch.save({"inputs": torch.randn(ROWS, F, generator=g), "targets": torch.randn(ROWS, O, generator=g)},
                   data_path)

        failures += check_split(torch, binary, d, model_path)

        ref_losses, ref_state = train_pytorch(torch, model_path, data_path)
        losses, state = train_pipeforge(torch, binary, os.path.join(d, "run"), model_path, data_path)
        initial = {k: v.detach() for k, v in torch.jit.load(model_path).named_parameters()}
        problems, loss_diff, diff = common.compare_training(torch, losses, ref_losses, state, ref_state, RTOL, ATOL,
                                                            initial)
        print(f"train scale 2.0, 2 ranks 1F1B: max |loss diff| {loss_diff:.2e}  max |param diff| {diff:.2e}  "
              f"{'ok' if not problems else 'MISMATCH'}", flush=True)
        failures += [f"training: {p}" for p in problems]

        failures += refusals(torch, binary, d, model_path, data_path)
    if failures:
        print("FAILED:\n" + "\n".join(failures))
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
