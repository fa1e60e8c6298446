#!/usr/bin/python3
"""Gradient clipping, no-decay groups, per-token loss, loss modules and the
foreach / fused Adam kernels equal single-process PyTorch (issues 13, 28).

Every case trains the zoo's `gpt.pt` (2 blocks, weights tied between `wte` and
the head, no dropout) for STEPS steps twice on the same token rows:
  * Pipeforge: `pipeforge train --nproc R` (split by the launcher), then
    `pipeforge export`, whose weights are read back with torch.jit.load;
  * PyTorch, one process: torch.jit.load of the same file trained on the same
    rows (interop_common.batch_rows mirrors Pipeforge's sampler), with the
    PyTorch code each feature names:
      - clip_grad_norm: torch.nn.utils.clip_grad_norm_(model.parameters(), X)
        after the microbatches' backward; its returned norm must equal the
        `grad_norm` Pipeforge logs (every step, before clipping);
      - no_decay: AdamW with two param groups built from named_parameters()
        (decay first; the globs matched with fnmatch);
      - per_token: the unsplit model's whole-batch mean cross-entropy over the
        targets that are not -1 (one forward and backward of the whole batch),
        with -1 targets spread unevenly over the microbatches; the
        per-microbatch mean must differ from it on that data, or the case
        proves nothing;
      - loss module: a scripted (and, with torch.export, an exported) label-
        smoothing loss, each microbatch's loss divided by their number;
      - per_token with a loss module: the same loss returning Megatron's
        (loss_sum, num_tokens); PyTorch divides the whole batch's sum by its
        count, as Megatron does with calculate_per_token_loss;
      - optimizer.foreach / optimizer.fused: torch.optim.AdamW (Adam) with
        foreach=True / fused=True (torch 2.4 and later; before, the
        refusal that names the fix).
Losses and final parameters must agree within rtol 1e-4, atol 1e-5 (float32
along different but equivalent paths; the measured differences are printed).
Layouts: 2 ranks 1F1B; 2 ranks ZBVZeroBubble (both tied ends on rank 0, in
two stages); 2 pipeline ranks x 2 data-parallel replicas.

Then the refusals (exit 1, the message naming the fix): a no_decay glob that
matches no parameter, per_token with a loss module returning one scalar, a
counting module without per_token, a missing loss module,
and on LibTorch 1.x optimizer.foreach and fused.

Usage: test_training_options_match_pytorch.py PIPEFORGE_BINARY ZOO_DIR
"""
import fnmatch
import inspect
import json
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import interop_common as common  # noqa: E402

STEPS = 4
MICROBATCHES = 4
ROWS_PER_MB = 4
BATCH = MICROBATCHES * ROWS_PER_MB
SEED = 11
RTOL, ATOL = 1e-4, 1e-5
VOCAB, BLOCK, ROWS = 64, 16, 48

# name -> (pipeline ranks, stages per rank, data parallel, schedule)
LAYOUTS = {"2r-1F1B": (2, 1, 1, "1F1B"), "2r-ZBV": (2, 2, 1, "ZBVZeroBubble"), "2pp-x-2dp": (2, 1, 2, "1F1B")}


def make_data(torch, path: str) -> None:
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, VOCAB, (ROWS, BLOCK + 1), generator=g)
    targets = tokens[:, 1:].clone()
    # Ignored targets, unevenly: some rows lose most of theirs, some none.
    keep = torch.rand(ROWS, BLOCK, generator=g) < torch.linspace(0.05, 1.0, ROWS).unsqueeze(1)
    targets[~keep] = -1
    torch.save({"inputs": tokens[:, :-1].contiguous(), "targets": targets.contiguous()}, path)


def write_losses(torch, d: str) -> dict:
    """A label-smoothing cross-entropy as a scripted module and, where torch.export exists, as a .pt2:
    "pt"/"pt2" return the mean, "count_pt"/"count_pt2" Megatron's (loss_sum, num_tokens)."""
    import torch.nn.functional as F

    class Smoothed(torch.nn.Module):
        def forward(self, logits, targets):
            return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1,
                                   label_smoothing=0.1)

    class SmoothedCount(torch.nn.Module):
        def forward(self, logits, targets):
            loss_sum = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1,
                                       label_smoothing=0.1, reduction="sum")
            return loss_sum, (targets != -1).sum()

    paths = {"pt": os.path.join(d, "smoothed.pt"), "count_pt": os.path.join(d, "smoothed_count.pt")}
    torch.jit.script(Smoothed()).save(paths["pt"])
    torch.jit.script(SmoothedCount()).save(paths["count_pt"])
    if hasattr(torch, "export") and hasattr(torch.export, "save"):
        example = (torch.randn(ROWS_PER_MB, BLOCK, VOCAB), torch.randint(0, VOCAB, (ROWS_PER_MB, BLOCK)))
        for key, module in (("pt2", Smoothed()), ("count_pt2", SmoothedCount())):
            paths[key] = os.path.join(d, f"{type(module).__name__.lower()}.pt2")
            torch.export.save(torch.export.export(module, example), paths[key])
    return paths


def train_pytorch(torch, model_path: str, data_path: str, case: dict, microbatches: int = MICROBATCHES):
    """`microbatches` over the whole batch: data_parallel d x MICROBATCHES gives the replicas' cut."""
    import torch.nn.functional as F
    model = torch.jit.load(model_path)
    model.train()
    data = torch.load(data_path)
    x_all, y_all = data["inputs"], data["targets"]
    named = list(model.named_parameters())
    if case.get("no_decay"):
        nd = [p for n, p in named if any(fnmatch.fnmatchcase(n, g) for g in case["no_decay"])]
        dec = [p for n, p in named if not any(fnmatch.fnmatchcase(n, g) for g in case["no_decay"])]
        groups = [{"params": dec}, {"params": nd, "weight_decay": 0.0}]
    else:
        groups = [{"params": [p for _, p in named]}]
    if case["optimizer"] in ("adam", "adamw"):
        # optimizer.foreach / fused select the arithmetic of PyTorch's flag of that name.
        impl = case.get("impl")
        cls = torch.optim.AdamW if case["optimizer"] == "adamw" else torch.optim.Adam
        opt = cls(groups, lr=case["lr"], weight_decay=case["wd"], foreach=impl == "foreach",
                  **({"fused": True} if impl == "fused" else {}))
    else:
        opt = torch.optim.SGD(groups, lr=case["lr"], weight_decay=case["wd"], foreach=False)
    loss_module = torch.jit.load(case["loss_module"]) if case.get("loss_module") else None
    losses, norms = [], []
    for step in range(STEPS):
        rows = torch.tensor(common.batch_rows(SEED, ROWS, step, BATCH))
        x, y = x_all.index_select(0, rows), y_all.index_select(0, rows)
        opt.zero_grad(set_to_none=True)
        if case.get("per_token"):
            out = model(x)
            if loss_module is not None:
                # Megatron's per-token loss: the whole batch's sum over its count.
                loss_sum, num_tokens = loss_module(out, y)
                loss = loss_sum / num_tokens
            else:
                loss = F.cross_entropy(out.reshape(-1, VOCAB), y.reshape(-1), ignore_index=-1)
            loss.backward()
            total = loss.item()
        else:
            total = 0.0
            rows_per_mb = BATCH // microbatches
            for mb in range(microbatches):
                part = slice(mb * rows_per_mb, (mb + 1) * rows_per_mb)
                out = model(x[part])
                if loss_module is not None:
                    loss = loss_module(out, y[part])
                else:
                    loss = F.cross_entropy(out.reshape(-1, VOCAB), y[part].reshape(-1), ignore_index=-1)
                (loss / microbatches).backward()
                total += loss.item() / microbatches
        if case.get("clip"):
            # torch 1.13's clip_grad_norm_ has no foreach switch (and no foreach path to switch off).
            clip = torch.nn.utils.clip_grad_norm_
            extra = {"foreach": False} if "foreach" in inspect.signature(clip).parameters else {}
            norms.append(clip(model.parameters(), case["clip"], **extra).item())
        opt.step()
        losses.append(total)
    return losses, norms, {k: v.detach().clone() for k, v in model.named_parameters()}


def config_text(run: str, model_path: str, data_path: str, case: dict, layout: tuple) -> str:
    pp, per_rank, dp, schedule = layout
    opt = f"name: {case['optimizer']}, lr: {case['lr']}, weight_decay: {case['wd']}"
    if case.get("clip"):
        opt += f", clip_grad_norm: {case['clip']}"
    if case.get("impl"):
        opt += f", {case['impl']}: true"
    if case.get("no_decay"):
        opt += ", no_decay: [" + ", ".join(f'"{g}"' for g in case["no_decay"]) + "]"
    loss = f"{{module: {case['loss_module']}}}" if case.get("loss_module") else "cross_entropy"
    extra = "loss_normalization: per_token\n" if case.get("per_token") else ""
    return f"""model: {{path: {model_path}, num_stages: {pp * per_rank}, policy: parameters}}
pipeline: {{schedule: {schedule}, microbatches: {MICROBATCHES}, stages_per_rank: {per_rank}, data_parallel: {dp}}}
loss: {loss}
{extra}optimizer: {{{opt}}}
lr_schedule: {{decay: constant, warmup_steps: 0}}
data: {{format: tensors, path: {data_path}, val_fraction: 0.0}}
training: {{steps: {STEPS}, global_batch_size: {BATCH}, seed: {SEED}, eval_every: 0}}
checkpoint: {{dir: {run}/ckpt}}
distributed: {{timeout_s: 60}}
output: {{dir: {run}/out}}
"""


def train_pipeforge(torch, binary: str, run: str, model_path: str, data_path: str, case: dict, layout: tuple):
    pp, per_rank, dp, schedule = layout
    with open(run + ".yaml", "w") as f:
        f.write(config_text(run, model_path, data_path, case, layout))
    common.run_pipeforge(binary, "train", "--config", run + ".yaml", "--nproc", str(pp * dp),
                         env={"OMP_NUM_THREADS": "1"})
    trained = os.path.join(run, "trained.pt")
    common.run_pipeforge(binary, "export", os.path.join(run, "ckpt"), "--model", model_path, "--out", trained)
    with open(os.path.join(run, "out", "metrics.jsonl")) as f:
        records = sorted((json.loads(line) for line in f), key=lambda r: r.get("step", 0))
    train = [r for r in records if r["event"] == "train"]
    state = {k: v.detach() for k, v in torch.jit.load(trained).named_parameters()}
    return train, state


def compare(torch, label: str, case: dict, train: list, state: dict, ref) -> list:
    ref_losses, ref_norms, ref_state = ref
    losses = [r["loss"] for r in train]
    problems, loss_diff, diff = common.compare_training(torch, losses, ref_losses, state, ref_state, RTOL, ATOL)
    if any("rows_per_s" not in r or "tokens_per_s" in r for r in train):
        problems.append("tensor data must report rows_per_s (and no tokens_per_s)")
    norm_diff = 0.0
    if case.get("clip"):
        norms = [r.get("grad_norm", float("nan")) for r in train]
        norm_diff = max((abs(a - b) / b for a, b in zip(norms, ref_norms)), default=float("inf"))
        if not norm_diff <= 1e-5:
            problems.append(f"grad_norm {norms} vs clip_grad_norm_ {ref_norms}")
        if not all(n > case["clip"] for n in ref_norms):
            problems.append(f"norms {ref_norms} never exceed {case['clip']}: clipping was not exercised")
    print(f"{label:34s} max |loss diff| {loss_diff:.2e}  max |param diff| {diff:.2e}  grad_norm rel diff "
          f"{norm_diff:.1e}  {'ok' if not problems else 'MISMATCH'}", flush=True)
    return [f"{label}: {p}" for p in problems]


def refusals(binary: str, d: str, model_path: str, data_path: str, loss_pt: str, count_pt: str,
             kernels: bool) -> list:
    cases = [
        ("no_decay glob matching nothing", {"optimizer": "adamw", "lr": 1e-3, "wd": 0.1, "no_decay": ["*.bais"]},
         ["optimizer.no_decay pattern '*.bais' matches no parameter"]),
        ("no_decay glob matching only the tied head", {"optimizer": "adamw", "lr": 1e-3, "wd": 0.1,
                                                       "no_decay": ["lm_head.*"]},
         ["matches only 'lm_head.weight', a tied name of 'wte.weight'", "use 'wte.weight'"]),
        ("per_token with a loss module returning one scalar",
         {"optimizer": "sgd", "lr": 0.1, "wd": 0.0, "per_token": True, "loss_module": loss_pt},
         ["per_token with a loss module needs it to return (loss_sum, num_tokens)", "per_microbatch"]),
        ("a counting loss module without per_token",
         {"optimizer": "sgd", "lr": 0.1, "wd": 0.0, "loss_module": count_pt},
         ["returns two scalars, (loss_sum, num_tokens)", "set loss_normalization: per_token"]),
        ("missing loss module", {"optimizer": "sgd", "lr": 0.1, "wd": 0.0,
                                 "loss_module": os.path.join(d, "nope.pt")},
         ["loss.module", "does not exist"]),
    ]
    if not kernels:
        cases += [(f"optimizer.{impl} on LibTorch 1.x", {"optimizer": "adamw", "lr": 1e-3, "wd": 0.0, "impl": impl},
                   [f"optimizer.{impl} needs LibTorch 2.4 or later", f"remove optimizer.{impl}"])
                  for impl in ("foreach", "fused")]
    problems = []
    for label, case, fragments in cases:
        run = os.path.join(d, "refuse-" + label.replace(" ", "_"))
        with open(run + ".yaml", "w") as f:
            f.write(config_text(run, model_path, data_path, case, LAYOUTS["2r-1F1B"]))
        problems += common.expect_refusal(binary, run + ".yaml", label, fragments)
    return problems


def main() -> None:
    binary, zoo = sys.argv[1], sys.argv[2]
    import torch
    torch.set_num_threads(1)
    model_path = os.path.join(zoo, "gpt.pt")
    # PyTorch's foreach and fused Adam(W) on CPU, and Pipeforge's (LibTorch 2.4 and later).
    kernels = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 4)
    failures = []
    with common.temp_dir("pf-train-options-") as d:
        data_path = os.path.join(d, "tokens.pt")
        make_data(torch, data_path)
        loss_paths = write_losses(torch, d)
        cases = {
            "clip": ({"optimizer": "sgd", "lr": 0.5, "wd": 0.0, "clip": 0.05}, list(LAYOUTS)),
            "no_decay": ({"optimizer": "adamw", "lr": 1e-2, "wd": 0.5, "no_decay": ["*.bias", "*ln*", "wte.*"]},
                         ["2r-1F1B", "2r-ZBV"]),
            "per_token": ({"optimizer": "sgd", "lr": 0.5, "wd": 0.0, "per_token": True}, list(LAYOUTS)),
        }
        if kernels:
            # optimizer.foreach / fused against PyTorch's flag of the same name.
            cases["adamw_fused"] = ({"optimizer": "adamw", "lr": 1e-2, "wd": 0.5, "impl": "fused"},
                                    ["2r-ZBV", "2pp-x-2dp"])
            cases["adamw_foreach"] = ({"optimizer": "adamw", "lr": 1e-2, "wd": 0.5, "impl": "foreach"}, ["2r-1F1B"])
            cases["adam_fused"] = ({"optimizer": "adam", "lr": 1e-2, "wd": 0.0, "impl": "fused"}, ["2r-1F1B"])
        for kind in ("pt", "pt2"):
            if kind in loss_paths:
                cases[f"loss_module_{kind}"] = ({"optimizer": "sgd", "lr": 0.5, "wd": 0.0,
                                                 "loss_module": loss_paths[kind], "ref_module": loss_paths["pt"]},
                                                ["2r-1F1B"])
        # Megatron's per-token loss from a custom loss function, (loss_sum, num_tokens).
        for kind, layouts in (("count_pt", ["2r-1F1B", "2pp-x-2dp"]), ("count_pt2", ["2r-ZBV"])):
            if kind in loss_paths:
                cases[f"per_token_module_{kind[6:]}"] = (
                    {"optimizer": "sgd", "lr": 0.5, "wd": 0.0, "per_token": True, "loss_module": loss_paths[kind],
                     "ref_module": loss_paths["count_pt"]}, layouts)
        for name, (case, layouts) in cases.items():
            refs = {}
            for layout in layouts:
                # Replicas average their microbatches' means: the whole batch cut into dp x MICROBATCHES parts.
                dp = LAYOUTS[layout][2]
                if dp not in refs:
                    refs[dp] = train_pytorch(torch, model_path, data_path,
                                             dict(case, loss_module=case["ref_module"]) if case.get("ref_module")
                                             else case, dp * MICROBATCHES)
                ref = refs[dp]
                run = os.path.join(d, f"{name}-{layout}")
                train, state = train_pipeforge(torch, binary, run, model_path, data_path, case, LAYOUTS[layout])
                failures += compare(torch, f"{name} {layout}", case, train, state, ref)
            ref = refs[1]
            if name == "per_token":
                # The default normalization trains differently on this data, or the case proves nothing.
                per_mb = train_pytorch(torch, model_path, data_path, dict(case, per_token=False))
                gap = max((per_mb[2][k] - ref[2][k]).abs().max().item() for k in ref[2])
                print(f"per-microbatch mean vs per-token: losses {per_mb[0][-1]:.5f} vs {ref[0][-1]:.5f} at the "
                      f"last step, max |param diff| {gap:.2e}")
                if gap <= 100 * ATOL:
                    failures.append(f"per_token: the data does not separate the normalizations (gap {gap:.2e})")
            if name == "no_decay":
                # Without the groups the result differs, so the comparison above tests them.
                plain = train_pytorch(torch, model_path, data_path, dict(case, no_decay=None))[2]
                if all(torch.allclose(plain[k], ref[2][k], rtol=RTOL, atol=ATOL) for k in plain):
                    failures.append("no_decay: decaying every parameter gives the same weights; raise the decay")
        failures += refusals(binary, d, model_path, data_path, loss_paths["pt"], loss_paths["count_pt"], kernels)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    kernels_said = " and the Adam kernels" if kernels else ""
    print(f"clipping, no-decay groups, per-token loss{kernels_said} and loss modules equal PyTorch (rtol {RTOL}, atol {ATOL})")


if __name__ == "__main__":
    main()
