#!/usr/bin/python3
"""Named model inputs and per-input chunk specs (pipeline.input_chunks) equal
single-process PyTorch (issue 13, "any inputs").

The model takes two inputs, forward(self, xt, mask): xt [F, N] holds the rows
along dim 1 (features first) and mask [F] is one vector shared by every row.
So the config says input_chunks {xt: 1, mask: replicate}: xt's rows are drawn,
shared out to replicas and cut into microbatches along dim 1, and every
microbatch gets the whole mask (Note [Input chunks] in data/data_layout.h).

Each case trains it for STEPS steps (mse, SGD) twice on the same rows:
  * Pipeforge: `pipeforge train --nproc R` (2 stages, 1F1B), then
    `pipeforge export`, read back with torch.jit.load;
  * PyTorch, one process: torch.jit.load of the same file; the step's rows
    from interop_common.batch_rows, taken along dim 1 of xt; the batch cut
    into data_parallel x MICROBATCHES parts along dim 1 (the mask whole), each
    part's loss divided by their number before its backward.
Losses and final parameters must agree within rtol 1e-4, atol 1e-5 (float32
along different but equivalent paths; the measured differences are printed).
Cases: the inputs as a dict by name in the order (mask, xt), the reverse of
the model's, with input_chunks as a map, on 2 ranks; the inputs as a tuple
(positional) with input_chunks as a list, on 2 pipeline ranks x 2 replicas.

Then the refusals (exit 1, the message naming the problem): a data key that
is not a model input, an input_chunks list of the wrong length, a chunk entry
that is neither a dim nor replicate.

Usage: test_named_inputs_match_pytorch.py PIPEFORGE_BINARY
"""
import json
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import interop_common as common  # noqa: E402

STEPS = 4
MICROBATCHES = 2
BATCH = 8
SEED = 7
LR = 0.1
RTOL, ATOL = 1e-4, 1e-5
F, H, O, ROWS = 6, 8, 3, 40


def write_model(torch, path: str) -> None:
    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(F, H)
            self.fc2 = torch.nn.Linear(H, O)

        def forward(self, xt, mask):
            return self.fc2(torch.tanh(self.fc1(xt.t() * mask)))

    torch.manual_seed(3)
    torch.jit.script(Masked()).save(path)


def write_data(torch, d: str) -> dict:
    g = torch.Generator().manual_seed(5)
    xt = torch.randn(F, ROWS, generator=g)
    mask = torch.linspace(0.2, 1.5, F)
    y = torch.randn(ROWS, O, generator=g)
    paths = {"dict": os.path.join(d, "named.pt"), "tuple": os.path.join(d, "tuple.pt"),
             "typo": os.path.join(d, "typo.pt")}
    torch.save({"inputs": {"mask": mask, "xt": xt}, "targets": y}, paths["dict"])  # not the model's order
    torch.save({"inputs": (xt, mask), "targets": y}, paths["tuple"])
    torch.save({"inputs": {"xt": xt, "maks": mask}, "targets": y}, paths["typo"])
    return paths


def train_pytorch(torch, model_path: str, data_path: str, parts: int):
    import torch.nn.functional as fn
    model = torch.jit.load(model_path)
    model.train()
    data = torch.load(data_path)
    xt_all, mask, y_all = data["inputs"]["xt"], data["inputs"]["mask"], data["targets"]
    opt = torch.optim.SGD(model.parameters(), lr=LR, foreach=False)
    losses = []
    for step in range(STEPS):
        rows = torch.tensor(common.batch_rows(SEED, ROWS, step, BATCH))
        xt, y = xt_all.index_select(1, rows), y_all.index_select(0, rows)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for x_mb, y_mb in zip(torch.tensor_split(xt, parts, 1), torch.tensor_split(y, parts, 0)):
            loss = fn.mse_loss(model(x_mb, mask), y_mb)
            (loss / parts).backward()
            total += loss.item() / parts
        opt.step()
        losses.append(total)
    return losses, {k: v.detach().clone() for k, v in model.named_parameters()}


def config_text(run: str, model_path: str, data_path: str, chunks: str, dp: int) -> str:
    return f"""model: {{path: {model_path}, num_stages: 2, policy: parameters}}
pipeline: {{schedule: 1F1B, microbatches: {MICROBATCHES}, data_parallel: {dp}, input_chunks: {chunks}}}
loss: mse
optimizer: {{name: sgd, lr: {LR}}}
lr_schedule: {{decay: constant, warmup_steps: 0}}
data: {{format: tensors, path: {data_path}, val_fraction: 0.0}}
training: {{steps: {STEPS}, global_batch_size: {BATCH}, seed: {SEED}, eval_every: 0}}
checkpoint: {{dir: {run}/ckpt}}
distributed: {{timeout_s: 60}}
output: {{dir: {run}/out}}
"""


def train_pipeforge(torch, binary: str, run: str, model_path: str, data_path: str, chunks: str, dp: int):
    with open(run + ".yaml", "w") as f:
        f.write(config_text(run, model_path, data_path, chunks, dp))
    common.run_pipeforge(binary, "train", "--config", run + ".yaml", "--nproc", str(2 * dp),
                         env={"OMP_NUM_THREADS": "1"})
    trained = os.path.join(run, "trained.pt")
    common.run_pipeforge(binary, "export", os.path.join(run, "ckpt"), "--model", model_path, "--out", trained)
    with open(os.path.join(run, "out", "metrics.jsonl")) as f:
        records = sorted((json.loads(line) for line in f), key=lambda r: r.get("step", 0))
    losses = [r["loss"] for r in records if r["event"] == "train"]
    state = {k: v.detach() for k, v in torch.jit.load(trained).named_parameters()}
    return losses, state


def refusals(binary: str, d: str, model_path: str, paths: dict) -> list:
    cases = [
        ("a data key that is not a model input", paths["typo"], "{xt: 1, mask: replicate}",
         ["has key 'maks', which is not an input of the model", "[xt, mask]", "[xt, maks]"]),
        ("input_chunks of the wrong length", paths["dict"], "[1]",
         ["pipeline.input_chunks has 1 entries but the model takes 2 inputs [xt, mask]"]),
        ("a chunk entry that is neither", paths["dict"], "[1, sideways]",
         ["pipeline.input_chunks[1] must be an integer dim >= 0 (split along it) or replicate", "'sideways'"]),
    ]
    problems = []
    for label, data_path, chunks, fragments in cases:
        run = os.path.join(d, "refuse-" + label.replace(" ", "_"))
        with open(run + ".yaml", "w") as f:
            f.write(config_text(run, model_path, data_path, chunks, 1))
        problems += common.expect_refusal(binary, run + ".yaml", label, fragments)
    return problems


def main() -> None:
    binary = sys.argv[1]
    torch = common.require_pipelining()
    torch.set_num_threads(1)
    failures = []
    with common.temp_dir("pf-named-inputs-") as d:
        model_path = os.path.join(d, "masked.pt")
        write_model(torch, model_path)
        paths = write_data(torch, d)
        cases = [("dict by name, 2 ranks", paths["dict"], "{mask: replicate, xt: 1}", 1),
                 ("tuple, 2pp x 2dp", paths["tuple"], "[1, replicate]", 2)]
        for label, data_path, chunks, dp in cases:
            ref_losses, ref_state = train_pytorch(torch, model_path, paths["dict"], dp * MICROBATCHES)
            run = os.path.join(d, label.split(",")[0].replace(" ", "_") + f"-dp{dp}")
            losses, state = train_pipeforge(torch, binary, run, model_path, data_path, chunks, dp)
            initial = {k: v.detach() for k, v in torch.jit.load(model_path).named_parameters()}
            problems, loss_diff, diff = common.compare_training(torch, losses, ref_losses, state, ref_state, RTOL,
                                                                ATOL, initial)
            print(f"{label:24s} max |loss diff| {loss_diff:.2e}  max |param diff| {diff:.2e}  "
                  f"{'ok' if not problems else 'MISMATCH'}", flush=True)
            failures += [f"{label}: {p}" for p in problems]
        failures += refusals(binary, d, model_path, paths)
    if failures:
        print("FAILED:\n" + "\n".join(failures))
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
