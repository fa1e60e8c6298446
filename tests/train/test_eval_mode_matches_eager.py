#!/usr/bin/env python3
"""Held-out losses run dropout and batch norm in eval mode, training runs them in train mode, whatever mode
the program was exported in.

torch.export bakes the module's mode into the graph: a model exported in train
mode holds `aten.dropout.default(x, p, True)`, sdpa calls with the attention's
`dropout_p`, and `aten.batch_norm.default(..., training=True, ...)` (which
updates running_mean / running_var in place); one exported in eval mode holds
`aten.dropout(x, p, False)`, `dropout_p` 0 and `aten.batch_norm(...,
training=False, ...)`. Setting the stage modules' training flag changes none of
these, so a held-out loss of a train-mode export used to draw dropout masks and
batch statistics (and its evaluations changed the running statistics that the
checkpoint saved), and training an eval-mode export used neither. Three checks,
each against the model itself in PyTorch:

  1. dropout, transformers: a tiny StableLmForCausalLM (2 layers, hidden_dropout
     0.5, attention_dropout 0.25; sdpa attention; seeded init with
     initializer_range 0.2 so that dropout moves the loss by 1e-2 or more)
     exported with a dynamic batch and sequence, trained 1 step of SGD with
     lr 1e-30 (lr must be > 0; 1e-30 x gradient is far below the weights'
     float32 spacing, so they stay the exported ones) on 2 ranks, 2 stages cut
     at model.layers.1, 1F1B, 2 microbatches, evaluated at step 1. The train
     and held-out token files (uint16) hold exactly block_size + 1 tokens, so
     every row of every batch is the same window.
       * exported in train mode: the run's "eval" event and `pipeforge eval`
         equal the transformers model in eval mode on that window (rtol 1e-5),
         and are the same for training.seed 11 and 2 (another seed changes
         only dropout masks here; |diff| <= 1e-7): two runs' eval events, and
         `pipeforge eval` with and without `--set training.seed=2`;
       * exported in eval mode: the eval event equals the same eval-mode loss,
         and training still drops out: the step's loss on the same window must
         differ from the eval-mode loss by more than 1e-3 (relative). Only the
         `aten.dropout` nodes can be switched back on: an eval export's sdpa
         calls hold dropout_p 0, the attention's probability is gone;
       * that the check can fail: the transformers model in train mode (torch
         seeds 0-2) gives losses that differ from the eval-mode loss by more
         than 1e-3 (asserted), and the train-mode export's training loss must
         too (dropout stays on for training).
  2. batch norm, train-mode export: Linear -> BatchNorm1d -> ReLU -> Linear ->
     BatchNorm1d -> ReLU -> Linear (a BatchNorm in each of the 2 stages, cut
     at `hidden`; running statistics moved off (0, 1) so eval mode is not the
     identity) trained 3 steps of SGD with momentum on 2 ranks (1F1B, 2
     microbatches of 4 rows), mse on `data.format: tensors` rows, evaluated at
     the last step (before the checkpoint is written). (a) Per-step losses,
     final parameters and every buffer (running_mean, running_var,
     num_batches_tracked: eager BatchNorm updates them once per microbatch
     forward, and the evaluation must not) equal eager train-mode training of
     the nn.Module with the same initial state on the same rows
     (interop_common.batch_rows), rtol 1e-4, atol 1e-5; the weights come back
     through `pipeforge export --out trained.pt2`. (b) The held-out loss of
     `pipeforge eval` and the run's eval event equal the nn.Module in eval mode
     (running statistics) holding the exported weights and buffers, on the
     held-out rows Pipeforge draws (stream 1 of interop_common.epoch_order),
     cut into the same microbatches, rtol 1e-5. The same batch with batch
     statistics (train mode) is printed and asserted to differ by > 1e-3.
  3. the opposite: the same network exported in EVAL mode trains with batch
     statistics and updates its running statistics: losses, parameters,
     running_mean and running_var equal the eager train-mode training of part
     2 (rtol 1e-4, atol 1e-5). num_batches_tracked is not compared: an eval
     export has no node that counts batches, and with BatchNorm's default
     momentum the count changes nothing.

StableLm rather than Llama: Llama has only attention dropout (inside sdpa);
StableLm also has hidden_dropout, i.e. plain `aten.dropout` nodes.
Measured values and differences are printed. About 15 s on 2 cores.

Usage: test_eval_mode_matches_eager.py PIPEFORGE_BINARY
"""
import copy
import json
import os
import re
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import interop_common as common  # noqa: E402

EVAL_RTOL = 1e-5          # one forward in float32 along different but equivalent paths
TRAIN_RTOL, TRAIN_ATOL = 1e-4, 1e-5
SEED_ATOL = 1e-7          # the same computation with another training.seed: bit-equal expected
DROPOUT_MIN_REL = 1e-3    # train-mode losses must differ from eval-mode ones by more than this (relative)
ENV = {"OMP_NUM_THREADS": "1"}

# part 1
VOCAB, BLOCK = 64, 16
LM_BATCH, LM_MICROBATCHES = 4, 2
LM_SEEDS = (11, 2)

# parts 2 and 3
FEATURES, WIDTH, OUTPUTS = 8, 16, 4
BN_ROWS, BN_VAL_ROWS = 32, 8
BN_MICROBATCHES, BN_ROWS_PER_MB = 2, 4
BN_STEPS, BN_SEED = 3, 5
LR, MOMENTUM = 0.1, 0.9


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def read_metrics(out_dir: str, event: str) -> list:
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return sorted((r for r in records if r["event"] == event), key=lambda r: r["step"])


def printed_loss(output: str) -> float:
    m = re.search(r"held-out loss (\S+) over", output)
    assert m, f"no held-out loss in:\n{output}"
    return float(m.group(1))


# --- part 1: dropout in a transformers model --------------------------------


def stablelm(torch, transformers):
    config = transformers.StableLmConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=4, intermediate_size=64, max_position_embeddings=64,
                                         hidden_dropout=0.5, attention_dropout=0.25, initializer_range=0.2,
                                         use_cache=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.StableLmForCausalLM(config).train()


def lm_config(d: str, name: str, model_path: str, train_bin: str, val_bin: str, seed: int) -> str:
    config = os.path.join(d, name + ".yaml")
    with open(config, "w") as f:
        f.write(f"""model: {{path: {model_path}, split_points: {{model.layers.1: BEGINNING}}}}
pipeline: {{schedule: 1F1B, microbatches: {LM_MICROBATCHES}}}
loss: cross_entropy
optimizer: {{name: sgd, lr: 1.0e-30}}
lr_schedule: {{decay: constant, warmup_steps: 0}}
data: {{format: tokens, dtype: uint16, path: {train_bin}, val_path: {val_bin}, block_size: {BLOCK}}}
training: {{steps: 1, global_batch_size: {LM_BATCH}, seed: {seed}, eval_every: 1, eval_batches: 1}}
checkpoint: {{dir: {d}/{name}/ckpt}}
distributed: {{timeout_s: 60}}
output: {{dir: {d}/{name}/out}}
""")
    return config


def export_lm(torch, model, training: bool, path: str) -> str:
    """Saves the model exported in the given mode; returns what its graph holds of dropout."""
    ids = torch.randint(0, VOCAB, (2, BLOCK), generator=torch.Generator().manual_seed(1))
    batch, seq = torch.export.Dim("batch", max=64), torch.export.Dim("seq", max=64)
    ep = torch.export.export(model.train(training), (ids,), dynamic_shapes=({0: batch, 1: seq},))
    model.train()
    torch.export.save(ep, path)
    calls = [n for n in ep.graph.nodes if n.op == "call_function"]
    flags = [n.args[2] if len(n.args) > 2 else n.kwargs.get("train") for n in calls if "dropout" in str(n.target)]
    sdpa = [n.args[4] if len(n.args) > 4 else n.kwargs.get("dropout_p", 0.0)
            for n in calls if "scaled_dot_product_attention" in str(n.target)]
    return f"aten.dropout train flags {flags}, sdpa dropout_p {sdpa}"


def train_lm(binary: str, d: str, name: str, model_path: str, train_bin: str, val_bin: str, seed: int):
    """One step, evaluated at step 1: (the run's eval event, its training loss), or a problem."""
    config = lm_config(d, name, model_path, train_bin, val_bin, seed)
    common.run_pipeforge(binary, "train", "--config", config, "--nproc", "2", env=ENV)
    evals = read_metrics(os.path.join(d, name, "out"), "eval")
    trains = read_metrics(os.path.join(d, name, "out"), "train")
    if len(evals) != 1 or len(trains) != 1:
        return None, f"{name}: {len(trains)} train and {len(evals)} eval events, expected 1 each"
    return (evals[0]["loss"], trains[0]["loss"]), None


def check_dropout(torch, binary: str, d: str) -> list:
    import transformers
    import torch.nn.functional as F
    failures = []
    model = stablelm(torch, transformers)
    paths = {mode: os.path.join(d, f"stablelm_{mode}.pt2") for mode in ("train", "eval")}
    graphs = {mode: export_lm(torch, model, mode == "train", path) for mode, path in paths.items()}

    # One window of BLOCK + 1 tokens: the only row of training and of held-out batches.
    window = torch.randint(0, VOCAB, (BLOCK + 1,), generator=torch.Generator().manual_seed(2))
    train_bin, val_bin = os.path.join(d, "train.bin"), os.path.join(d, "val.bin")
    for path in (train_bin, val_bin):
        with open(path, "wb") as f:
            f.write(window.numpy().astype("<u2").tobytes())
    x, y = window[:-1].unsqueeze(0), window[1:]
    with torch.no_grad():
        model.eval()
        eager_eval = F.cross_entropy(model(input_ids=x).logits[0], y).item()
        model.train()
        eager_train = []
        for s in range(3):
            torch.manual_seed(s)
            eager_train.append(F.cross_entropy(model(input_ids=x).logits[0], y).item())
    train_text = ", ".join(f"{v:.6g}" for v in eager_train)
    print(f"dropout: StableLm exported in train mode ({graphs['train']}) and in eval mode ({graphs['eval']})")
    print(f"dropout: transformers on the window: eval mode {eager_eval:.9g}, train mode (torch seeds 0-2) {train_text}")
    # The check has power only when dropout moves the loss well beyond the tolerance.
    if min(rel(v, eager_eval) for v in eager_train) < DROPOUT_MIN_REL:
        failures.append(f"dropout: train-mode losses {eager_train} are within {DROPOUT_MIN_REL} of eval mode "
                        f"{eager_eval}; the test cannot tell the modes apart")

    # (export mode, training.seed): the train-mode export with two seeds, the eval-mode export with one.
    runs = [("train", LM_SEEDS[0]), ("train", LM_SEEDS[1]), ("eval", LM_SEEDS[0])]
    events = {}
    for mode, seed in runs:
        label = f"{mode}-mode export, training.seed {seed}"
        result, problem = train_lm(binary, d, f"lm_{mode}_seed{seed}", paths[mode], train_bin, val_bin, seed)
        if problem:
            failures.append(f"dropout, {label}: {problem}")
            continue
        event, train_loss = events[(mode, seed)] = result
        print(f"dropout, {label}: the run's eval event {event:.9g} (rel diff to eval mode "
              f"{rel(event, eager_eval):.2e}); its training loss {train_loss:.9g} (rel diff to eval mode "
              f"{rel(train_loss, eager_eval):.2e}, must exceed {DROPOUT_MIN_REL:g}: dropout on)")
        if rel(event, eager_eval) > EVAL_RTOL:
            failures.append(f"dropout, {label}: the run's held-out loss {event:.9g} != transformers eval mode "
                            f"{eager_eval:.9g} (rel diff {rel(event, eager_eval):.2e}; train mode gives {train_text})")
        if rel(train_loss, eager_eval) < DROPOUT_MIN_REL:
            failures.append(f"dropout, {label}: the training loss {train_loss:.9g} on the held-out window is the "
                            f"eval-mode loss {eager_eval:.9g}: training ran without dropout")
    if ("train", LM_SEEDS[0]) in events and ("train", LM_SEEDS[1]) in events:
        a, b = events[("train", LM_SEEDS[0])][0], events[("train", LM_SEEDS[1])][0]
        print(f"dropout: eval events of training.seed {LM_SEEDS[0]} and {LM_SEEDS[1]} differ by {abs(a - b):.2e}")
        if abs(a - b) > SEED_ATOL:
            failures.append(f"dropout: the held-out loss depends on training.seed: {a:.9g} vs {b:.9g}")

    config = os.path.join(d, f"lm_train_seed{LM_SEEDS[0]}.yaml")
    printed = []
    for extra in ([], ["--set", f"training.seed={LM_SEEDS[1]}"]):
        got = printed_loss(common.run_pipeforge(binary, "eval", "--config", config, *extra, env=ENV))
        printed.append(got)
        label = "pipeforge eval" + (" " + " ".join(extra) if extra else "")
        print(f"dropout: {label} (train-mode export): {got:.9g}, rel diff to eval mode {rel(got, eager_eval):.2e}")
        if rel(got, eager_eval) > EVAL_RTOL:
            failures.append(f"dropout: {label} printed {got:.9g} != transformers eval mode {eager_eval:.9g} "
                            f"(rel diff {rel(got, eager_eval):.2e})")
    if abs(printed[0] - printed[1]) > SEED_ATOL:
        failures.append(f"dropout: pipeforge eval depends on training.seed: {printed[0]:.9g} vs {printed[1]:.9g}")
    return failures


# --- parts 2 and 3: batch norm ----------------------------------------------


def bn_net(torch):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = torch.nn.Linear(FEATURES, WIDTH)
            self.bn = torch.nn.BatchNorm1d(WIDTH)
            self.hidden = torch.nn.Linear(WIDTH, WIDTH)
            self.bn2 = torch.nn.BatchNorm1d(WIDTH)
            self.out = torch.nn.Linear(WIDTH, OUTPUTS)

        def forward(self, x):
            x = torch.relu(self.bn(self.inp(x)))
            return self.out(torch.relu(self.bn2(self.hidden(x))))

    torch.manual_seed(0)
    net = Net()
    with torch.no_grad():  # running statistics away from their (0, 1) start, so eval mode is not the identity
        for bn in (net.bn, net.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    return net


def bn_config(d: str, name: str, model_path: str, data: str, val: str, eval_every: int) -> str:
    config = os.path.join(d, name + ".yaml")
    with open(config, "w") as f:
        f.write(f"""model: {{path: {model_path}, split_points: {{hidden: BEGINNING}}}}
pipeline: {{schedule: 1F1B, microbatches: {BN_MICROBATCHES}}}
loss: mse
optimizer: {{name: sgd, lr: {LR}, momentum: {MOMENTUM}}}
lr_schedule: {{decay: constant, warmup_steps: 0}}
data: {{format: tensors, path: {data}, val_path: {val}}}
training: {{steps: {BN_STEPS}, global_batch_size: {BN_ROWS_PER_MB * BN_MICROBATCHES}, seed: {BN_SEED},
  eval_every: {eval_every}, eval_batches: 1}}
checkpoint: {{dir: {d}/{name}/ckpt}}
distributed: {{timeout_s: 60}}
output: {{dir: {d}/{name}/out}}
""")
    return config


def train_bn_eager(torch, net, data: dict):
    """Eager train-mode training, microbatch by microbatch as the pipeline cuts each step's rows."""
    import torch.nn.functional as F
    model = copy.deepcopy(net).train()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, foreach=False)
    x_all, y_all = data["inputs"], data["targets"]
    losses = []
    for step in range(BN_STEPS):
        rows = torch.tensor(common.batch_rows(BN_SEED, BN_ROWS, step, BN_ROWS_PER_MB * BN_MICROBATCHES))
        x, y = x_all.index_select(0, rows), y_all.index_select(0, rows)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for mb in range(BN_MICROBATCHES):
            part = slice(mb * BN_ROWS_PER_MB, (mb + 1) * BN_ROWS_PER_MB)
            loss = F.mse_loss(model(x[part]), y[part])
            (loss / BN_MICROBATCHES).backward()
            total += loss.item()
        opt.step()
        losses.append(total / BN_MICROBATCHES)
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def held_out_loss(torch, net, state: dict, val: dict, training: bool) -> float:
    """Held-out batch 0 of data/tensor_dataset.cpp (stream 1), microbatch means averaged, in the given mode."""
    import torch.nn.functional as F
    model = copy.deepcopy(net)
    model.load_state_dict(state, strict=True)
    model.train(training)
    batch = BN_ROWS_PER_MB * BN_MICROBATCHES
    order = common.epoch_order(BN_SEED, 0, BN_VAL_ROWS, stream=1)
    rows = torch.tensor([order[k % BN_VAL_ROWS] for k in range(batch)])
    x, y = val["inputs"].index_select(0, rows), val["targets"].index_select(0, rows)
    total = 0.0
    with torch.no_grad():
        for mb in range(BN_MICROBATCHES):
            part = slice(mb * BN_ROWS_PER_MB, (mb + 1) * BN_ROWS_PER_MB)
            total += F.mse_loss(model(x[part]), y[part]).item()
    return total / BN_MICROBATCHES


def train_bn_pipeforge(torch, binary: str, d: str, name: str, model_path: str, data: str, val: str,
                       eval_every: int):
    config = bn_config(d, name, model_path, data, val, eval_every)
    common.run_pipeforge(binary, "train", "--config", config, "--nproc", "2", env=ENV)
    trained = os.path.join(d, name, "trained.pt2")
    common.run_pipeforge(binary, "export", os.path.join(d, name, "ckpt"), "--model", model_path, "--out", trained)
    out = os.path.join(d, name, "out")
    losses = [r["loss"] for r in read_metrics(out, "train")]
    state = {k: v.detach().clone() for k, v in torch.export.load(trained).module().state_dict().items()}
    return config, losses, state, [r["loss"] for r in read_metrics(out, "eval")]


def check_batch_norm(torch, binary: str, d: str) -> list:
    failures = []
    net = bn_net(torch)
    initial = {k: v.detach().clone() for k, v in net.state_dict().items()}
    example = torch.randn(BN_ROWS_PER_MB, FEATURES, generator=torch.Generator().manual_seed(4))
    batch = torch.export.Dim("batch", min=2, max=64)
    paths = {}
    for mode in ("train", "eval"):
        paths[mode] = os.path.join(d, f"bn_{mode}.pt2")
        ep = torch.export.export(copy.deepcopy(net).train(mode == "train"), (example,), dynamic_shapes=({0: batch},))
        torch.export.save(ep, paths[mode])
    g = torch.Generator().manual_seed(3)
    data = {"inputs": torch.randn(BN_ROWS, FEATURES, generator=g) * 2 + 1,
            "targets": torch.randn(BN_ROWS, OUTPUTS, generator=g)}
    val = {"inputs": torch.randn(BN_VAL_ROWS, FEATURES, generator=g) * 2 + 1,
           "targets": torch.randn(BN_VAL_ROWS, OUTPUTS, generator=g)}
    data_path, val_path = os.path.join(d, "bn_data.pt"), os.path.join(d, "bn_val.pt")
    torch.save(data, data_path)
    torch.save(val, val_path)
    ref_losses, ref_state = train_bn_eager(torch, net, data)

    # 2(a): a train-mode export trains as eager train mode, running statistics included.
    config, losses, state, evals = train_bn_pipeforge(torch, binary, d, "bn_train", paths["train"], data_path,
                                                      val_path, BN_STEPS)
    problems, loss_diff, diff = common.compare_training(torch, losses, ref_losses, state, ref_state, TRAIN_RTOL,
                                                        TRAIN_ATOL, initial)
    stats = max((state[k].double() - ref_state[k].double()).abs().max().item()
                for k in ref_state if "running" in k and k in state)
    print(f"batch norm, train-mode export, training: max |loss diff| {loss_diff:.2e}, max |param/buffer diff| "
          f"{diff:.2e} (running stats {stats:.2e})  {'ok' if not problems else 'MISMATCH'}")
    failures += [f"batch norm, train-mode export, training: {p}" for p in problems]
    counted = [k for k in ref_state if k.endswith("num_batches_tracked") and k in state]
    extra = {k: int(state[k]) - int(ref_state[k]) for k in counted}
    if any(extra.values()):
        why = (f": the evaluation at step {BN_STEPS} ({BN_MICROBATCHES} microbatches) ran batch norm in train mode "
               "and changed the running statistics the checkpoint saved"
               if set(extra.values()) == {BN_MICROBATCHES} else "")
        failures.append(f"batch norm, train-mode export: num_batches_tracked is {extra} off eager's "
                        f"{BN_STEPS * BN_MICROBATCHES} training microbatches{why}")

    # 2(b): its held-out loss uses the running statistics.
    want = held_out_loss(torch, net, state, val, training=False)
    batch_stats = held_out_loss(torch, net, state, val, training=True)
    got = printed_loss(common.run_pipeforge(binary, "eval", "--config", config, env=ENV))
    print(f"batch norm, train-mode export, held-out: pipeforge eval {got:.9g}, the run's eval event "
          f"{evals[-1] if evals else float('nan'):.9g}; eager eval mode (running stats) {want:.9g}, eager train mode "
          f"(batch stats) {batch_stats:.9g}; rel diff {rel(got, want):.2e}")
    if rel(batch_stats, want) < DROPOUT_MIN_REL:
        failures.append(f"batch norm: batch statistics give {batch_stats:.9g}, running ones {want:.9g}: the test "
                        "cannot tell the modes apart")
    if rel(got, want) > EVAL_RTOL:
        failures.append(f"batch norm, train-mode export: pipeforge eval {got:.9g} != eager eval mode {want:.9g} "
                        f"(rel diff {rel(got, want):.2e}; with batch statistics {batch_stats:.9g})")
    if len(evals) != 1 or rel(evals[-1], want) > EVAL_RTOL:
        failures.append(f"batch norm, train-mode export: the run's eval events {evals} != eager eval mode {want:.9g}")

    # 3: an eval-mode export still trains with batch statistics.
    _, losses, state, _ = train_bn_pipeforge(torch, binary, d, "bn_eval", paths["eval"], data_path, val_path, 0)
    skip = [k for k in ref_state if k.endswith("num_batches_tracked")]
    for k in skip:
        state.pop(k, None)
    ref_trained = {k: v for k, v in ref_state.items() if k not in skip}
    problems, loss_diff, diff = common.compare_training(torch, losses, ref_losses, state, ref_trained, TRAIN_RTOL,
                                                        TRAIN_ATOL, {k: v for k, v in initial.items() if k not in skip})
    print(f"batch norm, eval-mode export, training: max |loss diff| {loss_diff:.2e}, max |param/buffer diff| "
          f"{diff:.2e}  {'ok' if not problems else 'MISMATCH'}")
    failures += [f"batch norm, eval-mode export, training: {p}" for p in problems]
    return failures


def main() -> None:
    binary = sys.argv[1]
    try:
        import torch
        import transformers
    except ImportError as e:
        common.skip(f"{sys.executable} cannot import torch and transformers: {e}")
    if not hasattr(torch, "export") or not hasattr(torch.export, "load"):
        common.skip(f"torch {torch.__version__} has no torch.export")
    if not hasattr(transformers, "StableLmForCausalLM"):
        common.skip(f"transformers {transformers.__version__} has no StableLmForCausalLM")
    torch.set_num_threads(1)
    failures = []
    start = time.time()
    with common.temp_dir("pf-eval-mode-") as d:
        failures += check_dropout(torch, binary, d)
        failures += check_batch_norm(torch, binary, d)
    print(f"({time.time() - start:.1f} s)")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print(f"held-out losses run in eval mode and training in train mode, whatever the export's mode (eval rtol "
          f"{EVAL_RTOL}, training rtol {TRAIN_RTOL}, atol {TRAIN_ATOL})")


if __name__ == "__main__":
    main()
