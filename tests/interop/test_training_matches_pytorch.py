#!/usr/bin/python3
"""Pipeforge trains as torch.distributed.pipelining does (issue 11, point 2).

The same model, cut at the same FQNs, trained 5 steps on the same batches with
the same microbatches, loss and optimizer, twice on 2 Gloo ranks:
  * Pipeforge: `pipeforge train --config C.yaml --nproc 2` on a `pipeforge
    split` folder (model.split_dir), then `pipeforge export` for the final
    parameters and output.dir/metrics.jsonl for the losses;
  * PyTorch: Pipeforge's own stage files (torch.jit.load of stage_<i>.pt, the
    same cut and initial weights) wrapped in torch.distributed.pipelining's
    PipelineStage, run by PyTorch's own Schedule1F1B /
    ScheduleInterleavedZeroBubble / ScheduleZBVZeroBubble, with torch.optim.
Both must agree on every step's loss (the mean of the microbatch losses; their
sum for the runs with pipeline.scale_grads: false against PyTorch's
scale_grads=False) and on every final parameter within rtol 1e-5, atol 1e-6
(float32).

Models: the zoo's `mlp` (mse) and a small untied decoder defined here
(cross-entropy with some targets at ignore_index -1); 2 stages for 1F1B, 4
(2 per rank) for the zero-bubble schedules; SGD (momentum, weight decay) and
AdamW (decoupled weight decay); constant learning rate. The batches come from
a `data.format: tensors` file; PyTorch draws the same rows with a mirror of
Pipeforge's sampler (interop_common.batch_rows), over several epochs.

What is left between the two, measured when this test was written (torch
2.13, CPU): nothing for SGD (bitwise equal losses and parameters); for AdamW
a few ulps (parameters up to 2.4e-7 apart, losses 1.2e-7), because
torch.optim.AdamW moves its first moment with exp_avg.lerp_(grad, 1 - beta1)
while LibTorch's torch::optim::AdamW, which Pipeforge uses, does
exp_avg.mul_(beta1).add_(grad, 1 - beta1) (torch/csrc/api/src/optim/adamw.cpp):
a rounding difference between PyTorch's two frontends, not Pipeforge's. With
that C++ update written in Python, AdamW runs are bitwise equal too.
Bitwise equality also needs a power-of-two microbatch count: Pipeforge
multiplies each microbatch loss by 1/M before its backward (Note [Loss
scaling], runtime/pipeline_runner.cpp), PyTorch divides the summed gradient by
M after the last backward (PipelineStage.scale_grads); both are exact for
M = 4, while for M = 3 they round differently (parameters ~1.5e-8 apart after
one SGD step, measured), well inside the tolerance.

Note [Thread count]: both sides run one intra-op thread per rank
(OMP_NUM_THREADS=1 for `pipeforge train`, torch.set_num_threads(1) here).
CPU kernels split some reductions by thread (LayerNorm's bias gradient sums
per-thread partials), so a different thread count moves results by an ulp;
`pipeforge train --nproc N` otherwise gives each rank LibTorch's default, all
cores (torchrun sets OMP_NUM_THREADS=1 for N > 1).

Usage: test_training_matches_pytorch.py PIPEFORGE_BINARY ZOO_DIR
Exit 77 (skipped) when this Python's torch lacks torch.distributed.pipelining.
"""
import json
import math
import os
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interop_common as common  # noqa: E402

RANKS = 2
STEPS = 5
BATCH = 8
MICROBATCHES = 4
ROWS = 24
VAL_FRACTION = 0.25  # 18 training rows: 5 steps of 8 rows cross two epoch boundaries
SEED = 11

# Pipeforge optimizer keys and the torch.optim construction they mean.
OPTIMIZERS = {
    "sgd": ("{name: sgd, lr: 0.05, momentum: 0.9, weight_decay: 0.01}",
            lambda torch, params: torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=0.01, foreach=False)),
    "adamw": ("{name: adamw, lr: 0.01, betas: [0.9, 0.999], eps: 1.0e-8, weight_decay: 0.1}",
              lambda torch, params: torch.optim.AdamW(params, lr=0.01, betas=(0.9, 0.999), eps=1e-8,
                                                      weight_decay=0.1, foreach=False)),
}

# schedule name -> (stages per rank, stages held by each rank)
SCHEDULES = {
    "1F1B": (1, [[0], [1]]),
    "InterleavedZeroBubble": (2, [[0, 2], [1, 3]]),
    "ZBVZeroBubble": (2, [[0, 3], [1, 2]]),
}

MODELS = {
    # name -> (loss, split points for 2 stages, for 4 stages)
    "mlp": ("mse", ["blocks.3"], ["blocks.1", "blocks.3", "blocks.5"]),
    "decoder": ("cross_entropy", ["blocks.1"], ["blocks.0", "blocks.1", "blocks.2"]),
}

# Every schedule with both optimizers on the mlp; the decoder once per
# schedule (both optimizers among them), to keep the test under a minute.
RUNS = [
    ("mlp", "1F1B", "sgd"),
    ("mlp", "1F1B", "adamw"),
    ("mlp", "InterleavedZeroBubble", "sgd"),
    ("mlp", "InterleavedZeroBubble", "adamw"),
    ("mlp", "ZBVZeroBubble", "sgd"),
    ("mlp", "ZBVZeroBubble", "adamw"),
    ("decoder", "1F1B", "adamw"),
    ("decoder", "InterleavedZeroBubble", "sgd"),
    ("decoder", "ZBVZeroBubble", "adamw"),
    # pipeline.scale_grads: false against PyTorch's scale_grads=False (summed microbatch losses).
    ("mlp", "1F1B", "sgd", False),
    ("decoder", "ZBVZeroBubble", "adamw", False),
]

VOCAB, CONTEXT, WIDTH, HEADS = 32, 8, 16, 2


def make_decoder():
    """A small GPT-style decoder without tied weights (lm_head is its own)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            # No qkv bias: a key bias gets an analytically zero gradient (softmax
            # ignores a constant per query), i.e. float noise that Adam would
            # blow up to full-size steps of random sign on each side.
            self.qkv = nn.Linear(WIDTH, 3 * WIDTH, bias=False)
            self.n_head = HEADS
            self.proj = nn.Linear(WIDTH, WIDTH)
            self.register_buffer("mask", torch.tril(torch.ones(CONTEXT, CONTEXT)).view(1, 1, CONTEXT, CONTEXT))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            B, T, C = x.size()
            q, k, v = self.qkv(x).split(C, dim=2)
            hs = C // self.n_head
            q = q.view(B, T, self.n_head, hs).transpose(1, 2)
            k = k.view(B, T, self.n_head, hs).transpose(1, 2)
            v = v.view(B, T, self.n_head, hs).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            att = F.softmax(att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf")), dim=-1)
            return self.proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1 = nn.LayerNorm(WIDTH)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(WIDTH)
            self.fc = nn.Linear(WIDTH, 4 * WIDTH)
            self.out = nn.Linear(4 * WIDTH, WIDTH)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attn(self.ln_1(x))
            return x + self.out(F.gelu(self.fc(self.ln_2(x))))

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(VOCAB, WIDTH)
            self.wpe = nn.Embedding(CONTEXT, WIDTH)
            self.blocks = nn.ModuleList(Block() for _ in range(3))
            self.ln_f = nn.LayerNorm(WIDTH)
            self.lm_head = nn.Linear(WIDTH, VOCAB)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.blocks:
                x = block(x)
            return self.lm_head(self.ln_f(x))

    torch.manual_seed(21)
    return Decoder()


def write_inputs(d: str, zoo: str) -> dict:
    """Model files and data files; returns {model: (model path, data path)}."""
    import torch

    decoder = os.path.join(d, "decoder.pt")
    torch.jit.script(make_decoder()).save(decoder)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(ROWS, 8, generator=g)
    torch.save({"inputs": x, "targets": torch.tanh(x @ torch.randn(8, 4, generator=g))}, os.path.join(d, "mlp_data.pt"))
    tokens = torch.randint(0, VOCAB, (ROWS, CONTEXT + 1), generator=g)
    targets = tokens[:, 1:].clone()
    targets[torch.rand(targets.shape, generator=g) < 0.1] = -1  # ignore_index
    torch.save({"inputs": tokens[:, :-1].contiguous(), "targets": targets}, os.path.join(d, "decoder_data.pt"))
    return {"mlp": (os.path.join(zoo, "mlp.pt"), os.path.join(d, "mlp_data.pt")),
            "decoder": (decoder, os.path.join(d, "decoder_data.pt"))}


def split(binary: str, model_path: str, cuts: list, out: str) -> None:
    spec = out + ".yaml"
    with open(spec, "w") as f:
        f.write("split_points:\n" + "".join(f"  {fqn}: BEGINNING\n" for fqn in cuts))
    common.run_pipeforge(binary, "split", model_path, "--spec", spec, "--out", out)
    with open(os.path.join(out, "pipe.json")) as f:
        pipe = json.load(f)
    # PipelineStage passes a stage's outputs to the next stage only: the cut
    # must be a chain (no value skipping a stage, no root input past stage 0).
    for i, stage in enumerate(pipe["stages"]):
        want = ([{"from": "input", "index": k} for k in range(len(pipe["inputs"]))] if i == 0 else
                [{"from": "stage", "stage": i - 1, "index": k} for k in range(pipe["stages"][i - 1]["num_outputs"])])
        assert stage["inputs"] == want, f"{out}: stage {i} reads {stage['inputs']}; the test needs a chain"
    assert not pipe["tied"], f"{out}: tied weights {pipe['tied']}; this test needs an untied model"


def train_pipeforge(binary: str, d: str, case: dict) -> tuple:
    """Returns (losses per step, {fqn: final parameter})."""
    import torch

    name = case["name"]
    ckpt, out = os.path.join(d, name, "ckpt"), os.path.join(d, name, "out")
    config = os.path.join(d, name + ".yaml")
    with open(config, "w") as f:
        f.write(f"""model: {{split_dir: {case['split_dir']}}}
pipeline: {{schedule: {case['schedule']}, microbatches: {MICROBATCHES}, stages_per_rank: {case['per_rank']}, scale_grads: {str(case['scale_grads']).lower()}}}
loss: {case['loss']}
optimizer: {OPTIMIZERS[case['optimizer']][0]}
lr_schedule: {{decay: constant, warmup_steps: 0}}
data: {{format: tensors, path: {case['data']}, val_fraction: {VAL_FRACTION}}}
training: {{steps: {STEPS}, global_batch_size: {BATCH}, seed: {SEED}, eval_every: 0}}
checkpoint: {{dir: {ckpt}}}
distributed: {{timeout_s: 60}}
output: {{dir: {out}}}
""")
    # One intra-op thread per rank on both sides (Note [Thread count] below).
    common.run_pipeforge(binary, "train", "--config", config, "--nproc", str(RANKS), env={"OMP_NUM_THREADS": "1"})
    trained = os.path.join(d, name, "trained.pt")
    common.run_pipeforge(binary, "export", ckpt, "--model", case["model"], "--out", trained)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    losses = [r["loss"] for r in sorted((r for r in records if r["event"] == "train"), key=lambda r: r["step"])]
    params = {k: v.detach() for k, v in torch.jit.load(trained).named_parameters()}
    return losses, params


def rank_main(rank: int, world: int, cases: list, d: str) -> None:
    import torch
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules

    for case in cases:
        data = torch.load(case["data"])
        inputs, targets = data["inputs"], data["targets"]
        train_rows = common.training_rows(inputs.size(0), VAL_FRACTION)
        per_rank, layout = SCHEDULES[case["schedule"]]
        local = layout[rank]
        num_stages = RANKS * per_rank

        def loss_fn(output, target):
            out = output[0] if isinstance(output, tuple) else output
            if case["loss"] == "mse":
                return F.mse_loss(out, target.to(out.dtype))
            return F.cross_entropy(out.reshape(-1, out.size(-1)), target.reshape(-1).long(), ignore_index=-1)

        modules = {s: torch.jit.load(os.path.join(case["split_dir"], f"stage_{s}.pt")) for s in local}
        for m in modules.values():
            m.train()
        stages = [PipelineStage(modules[s], s, num_stages, torch.device("cpu")) for s in local]
        schedule = getattr(schedules, "Schedule" + case["schedule"])(stages[0] if per_rank == 1 else stages,
                                                                     MICROBATCHES, loss_fn=loss_fn,
                                                                     scale_grads=case["scale_grads"])
        # One optimizer per stage, as Pipeforge keeps them.
        optimizers = [OPTIMIZERS[case["optimizer"]][1](torch, list(modules[s].parameters())) for s in local]

        step_losses = []
        for step in range(STEPS):
            rows = torch.tensor(common.batch_rows(SEED, train_rows, step, BATCH))
            x, y = inputs[:train_rows].index_select(0, rows), targets[:train_rows].index_select(0, rows)
            losses = []
            schedule.step(*((x,) if 0 in local else ()),
                          **({"target": y, "losses": losses} if num_stages - 1 in local else {}))
            losses = [l.detach() for l in losses]
            for opt in optimizers:
                opt.step()
                opt.zero_grad(set_to_none=True)
            if losses:
                # The step's loss as Pipeforge logs it: the mean of the microbatch
                # losses, or their sum with scale_grads=False.
                total = sum(l.item() for l in losses)
                step_losses.append(total / len(losses) if case["scale_grads"] else total)
        params = {}
        for s in local:
            params.update({k: v.detach().clone() for k, v in modules[s].named_parameters()})
        torch.save({"losses": step_losses, "params": params}, os.path.join(d, f"{case['name']}.rank{rank}.pt"))


def main() -> None:
    binary, zoo = sys.argv[1], sys.argv[2]
    torch = common.require_pipelining()
    torch.set_num_threads(1)
    with common.temp_dir("pf-interop-train-") as d:
        files = write_inputs(d, zoo)
        cases = []
        for model, (_, cuts2, cuts4) in MODELS.items():
            for stages, cuts in ((2, cuts2), (4, cuts4)):
                split(binary, files[model][0], cuts, os.path.join(d, f"{model}_{stages}"))
        for model, schedule, optimizer, *rest in RUNS:
            scale_grads = rest[0] if rest else True
            model_path, data_path = files[model]
            per_rank = SCHEDULES[schedule][0]
            cases.append({"name": f"{model}-{schedule}-{optimizer}" + ("" if scale_grads else "-sum"),
                          "model": model_path, "loss": MODELS[model][0],
                          "split_dir": os.path.join(d, f"{model}_{RANKS * per_rank}"), "data": data_path,
                          "schedule": schedule, "per_rank": per_rank, "optimizer": optimizer,
                          "scale_grads": scale_grads})
        started = time.monotonic()
        pipeforge = {c["name"]: train_pipeforge(binary, d, c) for c in cases}
        pipeforge_s = time.monotonic() - started
        common.run_ranks(RANKS, rank_main, cases, d)
        print(f"trained {len(cases)} runs: Pipeforge in {pipeforge_s:.1f} s, PyTorch in "
              f"{time.monotonic() - started - pipeforge_s:.1f} s")

        failures = []
        for case in cases:
            name = case["name"]
            pf_losses, pf_params = pipeforge[name]
            pt_losses, pt_params = [], {}
            for r in range(RANKS):
                got = torch.load(os.path.join(d, f"{name}.rank{r}.pt"))
                pt_losses += got["losses"]
                pt_params.update(got["params"])
            initial = {k: v for k, v in torch.jit.load(case["model"]).named_parameters()}
            problems = []
            if len(pf_losses) != STEPS or len(pt_losses) != STEPS:
                problems.append(f"{len(pf_losses)} Pipeforge and {len(pt_losses)} PyTorch losses for {STEPS} steps")
            loss_diff = max((abs(a - b) for a, b in zip(pf_losses, pt_losses)), default=math.inf)
            if not all(common.close(a, b) for a, b in zip(pf_losses, pt_losses)):
                problems.append(f"losses differ: Pipeforge {pf_losses}, PyTorch {pt_losses}")
            if sorted(pf_params) != sorted(pt_params) or sorted(pt_params) != sorted(initial):
                problems.append(f"parameter names differ: Pipeforge {sorted(pf_params)}, PyTorch {sorted(pt_params)}")
            param_diff, moved = 0.0, 0
            for fqn in sorted(set(pf_params) & set(pt_params)):
                a, b = pf_params[fqn], pt_params[fqn]
                param_diff = max(param_diff, (a - b).abs().max().item())
                moved += not torch.equal(b, initial[fqn])
                if not torch.allclose(a, b, rtol=common.RTOL, atol=common.ATOL):
                    problems.append(f"{fqn}: max |diff| {(a - b).abs().max().item():.3g}")
            if moved == 0:
                problems.append("training moved no parameter")
            print(f"{name:36s} losses {' '.join(f'{l:.6f}' for l in pf_losses)}  max |loss diff| {loss_diff:.2e}  "
                  f"max |param diff| {param_diff:.2e}  {'ok' if not problems else 'MISMATCH'}")
            failures += [f"{name}: {p}" for p in problems]
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print(f"{len(cases)} runs: Pipeforge and torch.distributed.pipelining agree on every loss and final parameter "
          f"(rtol {common.RTOL}, atol {common.ATOL})")


if __name__ == "__main__":
    main()
