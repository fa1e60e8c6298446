#!/usr/bin/env python3
"""Pipelined training of stock transformers models equals eager training of the model itself (issue 23).

For every family of the transformers zoo (tests/models/generate_hf_zoo.py:
Llama, Qwen2 with tied embeddings, Qwen3, Mistral, Gemma, Gemma2, Gemma3,
Phi-3, OLMo2, GPT-NeoX, Falcon, Mixtral with batched_mm experts, GPT-2, BERT,
ViT, and T5, whose encoder output skips every decoder cut) and every layout
below, the same steps run twice:
  * Pipeforge: `pipeforge train --nproc R` with `model.path: NAME.pt2` (the
    program exactly as torch.export saved it, split by the launcher), then
    `pipeforge export --out trained.pt2`, whose weights go back into a fresh
    transformers model with load_state_dict(strict=True): under the model's own
    names, tied ones included;
  * PyTorch, one process: the transformers model built from the same config
    and initial weights, trained eagerly on the same rows
    (interop_common.batch_rows mirrors Pipeforge's sampler), cut into the same
    microbatches (data_parallel x microbatches of consecutive rows), each
    microbatch's mean cross-entropy divided by their number before backward.
Per-step losses and final weights must agree within rtol 1e-4, atol 1e-5
(float32 along different but equivalent paths); the figures are printed as a
family x layout table.

Also refused before any rank starts, each with its fix: Mixtral with its
default experts (the Python-only custom op transformers::grouped_mm_fallback,
fix experts_implementation="batched_mm"), and a Llama exported with a static
sequence length trained on another (fix: dynamic_shapes=).

Usage: test_hf_training_matches_eager.py PIPEFORGE_BINARY HF_ZOO_DIR [FAMILY ... | --refusals]
"""
import json
import os
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import interop_common as common  # noqa: E402

STEPS = 5
MICROBATCHES = 4
ROWS_PER_MB = 3  # the export's example had 2 rows of 16 tokens: any size its ranges allow trains
SEED = 7
RTOL, ATOL = 1e-4, 1e-5
SEQ, TARGET_SEQ = 20, 9
DATA_ROWS = 48

# label -> (schedule, pipeline ranks, stages per rank, data parallel, optimizer[, zero stage, families,
#           tensor parallel, extra pipeline keys])
SGD = "name: sgd, lr: 0.05, momentum: 0.9, weight_decay: 0.01"
# eps 1e-6, not 1e-8: Adam divides by sqrt(v) + eps, so with 1e-8 a weight
# whose gradient is ~1e-8 moves by lr on the sign of float noise (the
# all-reduce sums in another order than one process does).
ADAMW = "name: adamw, lr: 0.001, weight_decay: 0.01, eps: 1.0e-6"
LAYOUTS = {
    "1F1B": ("1F1B", 2, 1, 1, SGD),
    "ZBV": ("ZBVZeroBubble", 2, 2, 1, SGD),
    "DualPipeV": ("DualPipeV", 2, 2, 1, SGD),
    "1F1B x DP2": ("1F1B", 2, 1, 2, ADAMW),
    # ZeRO (issue 42): the optimizer state (stage 1), the gradients too
    # (stage 2) and the parameters as well (stage 3, gathered at UNSHARD),
    # sharded over the 2 replicas, on Llama and on Qwen2 (embeddings tied
    # across the pipeline).
    "DP2 ZeRO-1": ("DualPipeV", 2, 2, 2, ADAMW, 1, {"llama", "qwen2"}),
    "DP2 ZeRO-2": ("ZBVZeroBubble", 2, 2, 2, ADAMW, 2, {"llama", "qwen2"}),
    "DP2 ZeRO-3": ("Interleaved1F1B", 2, 2, 2, ADAMW, 3, {"llama", "qwen2"}),
    # Llama at zero 3 on the other three schedules too, one stage per rank on 1F1B.
    "ZeRO-3 1F1B": ("1F1B", 2, 1, 2, ADAMW, 3, {"llama"}),
    "ZeRO-3 ZBV": ("ZBVZeroBubble", 2, 2, 2, ADAMW, 3, {"llama"}),
    "ZeRO-3 DualPipeV": ("DualPipeV", 2, 2, 2, ADAMW, 3, {"llama"}),
    # Tensor parallel (issue 44), planned from each stage's graph, 4 ranks:
    # pp2 x tp2 on 1F1B and on ZBVZeroBubble (its I/W split keeps f's
    # all-reduce in I), and tp2 x dp2 on one pipeline rank. Llama and Mistral
    # take the loss from logits split by vocabulary (pipeline.loss_parallel,
    # the default); Qwen2 and Gemma tie lm_head to the embedding, kept whole.
    "PP2 x TP2 1F1B": ("1F1B", 2, 1, 1, ADAMW, 0, {"llama", "qwen2", "mistral", "gemma"}, 2),
    "PP2 x TP2 ZBV": ("ZBVZeroBubble", 2, 2, 1, SGD, 0, {"llama", "qwen2", "mistral", "gemma"}, 2),
    "TP2 x DP2": ("1F1B", 1, 1, 2, ADAMW, 0, {"llama", "qwen2", "mistral", "gemma"}, 2),
    # ZeRO over each rank's tensor-parallel blocks: 4 and 8 ranks.
    "TP2xDP2 ZeRO-1": ("1F1B", 1, 1, 2, ADAMW, 1, {"llama"}, 2),
    "PP2xTP2xDP2 Z2": ("ZBVZeroBubble", 2, 2, 2, ADAMW, 2, {"llama"}, 2),
    "PP2xTP2xDP2 Z3": ("Interleaved1F1B", 2, 2, 2, ADAMW, 3, {"llama"}, 2),
    # Sequence parallel: norms and residual adds on each rank's part of the
    # sequence, a gather before each column and a reduce-scatter after each row.
    "PP2 x TP2 SP": ("1F1B", 2, 1, 1, ADAMW, 0, {"llama", "qwen2", "mistral", "gemma"}, 2,
                     ", sequence_parallel: true"),
    "PP2 x TP2 SP ZBV": ("ZBVZeroBubble", 2, 2, 1, SGD, 0, {"llama"}, 2, ", sequence_parallel: true"),
    # Recompute (activation checkpointing) runs the rewritten stage again, its collectives with it.
    "PP2xTP2 ZBV AC": ("ZBVZeroBubble", 2, 2, 1, SGD, 0, {"llama"}, 2, ", activation_checkpointing: full"),
    "PP2xTP2 SP AC mb": ("1F1B", 2, 1, 1, ADAMW, 0, {"llama"}, 2,
                         ", sequence_parallel: true, activation_checkpointing: {microbatches: 1}"),
    # OLMo2 normalizes q and k over all heads, which auto refuses: an
    # explicit plan (torchtitan's words) splits its MLP and keeps attention whole.
    "PP2 x TP2 MLP plan": ("1F1B", 2, 1, 1, ADAMW, 0, {"olmo2"}, 2,
                           ', tensor_parallel_plan: {"layers.*.mlp.gate_proj": colwise, '
                           '"layers.*.mlp.up_proj": colwise, "layers.*.mlp.down_proj": rowwise}'),
}


def make_data(torch, meta: dict, path: str) -> None:
    g = torch.Generator().manual_seed(3)
    if meta["kind"] == "image":
        c, h, w = meta["image"]
        inputs = torch.randn(DATA_ROWS, c, h, w, generator=g)
        targets = torch.randint(0, meta["labels"], (DATA_ROWS,), generator=g)
    elif meta["kind"] == "seq2seq":
        inputs = (torch.randint(0, meta["vocab"], (DATA_ROWS, SEQ), generator=g),
                  torch.randint(0, meta["vocab"], (DATA_ROWS, TARGET_SEQ), generator=g))
        targets = torch.randint(0, meta["vocab"], (DATA_ROWS, TARGET_SEQ), generator=g)
    else:
        tokens = torch.randint(0, meta["vocab"], (DATA_ROWS, SEQ + 1), generator=g)
        inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    torch.save({"inputs": inputs, "targets": targets}, path)


def hf_model(torch, zoo: str, name: str, meta: dict):
    """A fresh transformers model from the zoo's config, with the zoo's initial weights."""
    import transformers
    config = getattr(transformers, meta["config_class"]).from_dict(meta["config"])
    config._attn_implementation = meta["attn_implementation"]  # what was exported: eager or sdpa
    model = getattr(transformers, meta["model_class"])(config)
    if meta["gradient_checkpointing"]:
        model.gradient_checkpointing_enable()
    model.load_state_dict(torch.load(os.path.join(zoo, name + ".init.pt")), strict=True)
    return model.train()


def logits_of(model, meta: dict, xs: list):
    if meta["kind"] == "image":
        return model(pixel_values=xs[0]).logits
    if meta["kind"] == "seq2seq":
        return model(input_ids=xs[0], decoder_input_ids=xs[1]).logits
    return model(input_ids=xs[0]).logits


def make_optimizer(torch, params, spec: str):
    if spec == SGD:
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=0.01, foreach=False)
    return torch.optim.AdamW(params, lr=0.001, weight_decay=0.01, eps=1e-6, foreach=False)


def train_eager(torch, zoo: str, name: str, meta: dict, data_path: str, layout: tuple):
    import torch.nn.functional as F
    _, _, _, dp, opt_spec, *_ = layout
    model = hf_model(torch, zoo, name, meta)
    data = torch.load(data_path)
    inputs = list(data["inputs"]) if isinstance(data["inputs"], tuple) else [data["inputs"]]
    targets = data["targets"]
    opt = make_optimizer(torch, model.parameters(), opt_spec)
    microbatches = MICROBATCHES * dp
    batch = ROWS_PER_MB * microbatches
    losses = []
    for step in range(STEPS):
        rows = torch.tensor(common.batch_rows(SEED, DATA_ROWS, step, batch))
        xs = [t.index_select(0, rows) for t in inputs]
        y = targets.index_select(0, rows)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for mb in range(microbatches):
            part = slice(mb * ROWS_PER_MB, (mb + 1) * ROWS_PER_MB)
            out = logits_of(model, meta, [x[part] for x in xs])
            loss = F.cross_entropy(out.reshape(-1, out.size(-1)), y[part].reshape(-1))
            (loss / microbatches).backward()
            total += loss.item() / microbatches
        opt.step()
        losses.append(total)
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def train_pipeforge(torch, binary: str, d: str, zoo: str, name: str, meta: dict, data_path: str, label: str,
                    layout: tuple):
    schedule, pp, per_rank, dp, opt_spec, *zero = layout
    tp = layout[7] if len(layout) > 7 else 1
    pipeline_extra = layout[8] if len(layout) > 8 else ""
    run = os.path.join(d, f"{name}-{label.replace(' ', '')}")
    config = run + ".yaml"
    model_path = os.path.join(zoo, name + ".pt2")
    with open(config, "w") as f:
        f.write(f"""model: {{path: {model_path}, num_stages: {pp * per_rank}, policy: parameters}}
pipeline: {{schedule: {schedule}, microbatches: {MICROBATCHES}, stages_per_rank: {per_rank}, data_parallel: {dp}, zero_stage: {zero[0] if zero else 0}, tensor_parallel: {tp}{pipeline_extra}}}
loss: cross_entropy
optimizer: {{{opt_spec}}}
lr_schedule: {{decay: constant, warmup_steps: 0}}
data: {{format: tensors, path: {data_path}, val_fraction: 0.0}}
training: {{steps: {STEPS}, global_batch_size: {ROWS_PER_MB * MICROBATCHES * dp}, seed: {SEED}, eval_every: 0}}
checkpoint: {{dir: {run}/ckpt}}
distributed: {{timeout_s: 60}}
output: {{dir: {run}/out}}
""")
    common.run_pipeforge(binary, "train", "--config", config, "--nproc", str(pp * dp * tp),
                         env={"OMP_NUM_THREADS": "1"})
    trained = os.path.join(run, "trained.pt2")
    common.run_pipeforge(binary, "export", os.path.join(run, "ckpt"), "--model", model_path, "--out", trained)
    with open(os.path.join(run, "out", "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    losses = [r["loss"] for r in sorted((r for r in records if r["event"] == "train"), key=lambda r: r["step"])]
    # The trained weights, back in the transformers model under its own names.
    exported = torch.export.load(trained).module().state_dict()
    model = hf_model(torch, zoo, name, meta)
    model.load_state_dict(exported, strict=True)
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}, model


def check_generate(torch, binary: str, d: str, zoo: str, name: str, label: str, model) -> list:
    """`pipeforge generate` from the run's checkpoint, greedy, equals greedy
    decoding of the transformers model holding the exported weights, the
    context growing by one token per step (a new sequence length each time,
    through the export's dynamic dimension)."""
    import re
    run = os.path.join(d, f"{name}-{label.replace(' ', '')}")
    prompt = [5, 17, 33]
    tokens = 6
    out = common.run_pipeforge(binary, "generate", os.path.join(run, "ckpt"), "--model",
                               os.path.join(zoo, name + ".pt2"), "--prompt-tokens", ",".join(map(str, prompt)),
                               "--tokens", str(tokens), "--temperature", "0")
    m = re.search(r"^continuation: \[(.*)\]$", out, re.M)
    got = [int(v) for v in m.group(1).split(", ")] if m else None
    ids = list(prompt)
    model.eval()
    with torch.no_grad():
        for _ in range(tokens):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(torch.argmax(logits)))
    want = ids[len(prompt):]
    problems = []
    if got != want:
        problems.append(f"{name} generate: {got} vs transformers greedy {want}:\n{out}")
    if "context: at most 64 tokens (the longest sequence the model was exported for)" not in out:
        problems.append(f"{name} generate does not say its context comes from the export:\n{out}")
    print(f"{name:9s} generate    greedy {got} {'== transformers' if not problems else 'MISMATCH'}")
    return problems


def check_refusals(binary: str, d: str, zoo: str) -> list:
    problems = []
    data = os.path.join(d, "llama_data.pt")
    cases = [  # model file, expected fragments, precision
        ("mixtral_grouped_mm.pt2", ["transformers::grouped_mm_fallback", "defined only in Python",
                                    'experts_implementation="batched_mm"'], "fp32"),
        ("llama_static.pt2", ["exported with a static size of 16 in dimension 1", "'input_ids'",
                              "dynamic_shapes="], "fp32"),
        # Note [Stale dtype checks]: the fp32 export's dtype checks under bf16 autocast, as
        # ExportedProgram.module() fails them under torch.autocast.
        ("llama.pt2", ["Tensor dtype mismatch! Expected: Float, Got: c10::BFloat16",
                       "aten._assert_tensor_metadata", "training.precision: fp32",
                       "with torch.autocast(device_type, dtype)"], "bf16"),
    ]
    for model, fragments, precision in cases:
        run = os.path.join(d, f"refuse-{model.replace('.', '_')}-{precision}")
        config = run + ".yaml"
        # The static Llama was exported for 2 rows of 16 tokens: 2-row
        # microbatches of 16 tokens would fit, so the data has 24.
        rows_file = data if "static" not in model else os.path.join(d, "long_rows.pt")
        with open(config, "w") as f:
            f.write(f"""model: {{path: {os.path.join(zoo, model)}, num_stages: 2, policy: parameters}}
pipeline: {{schedule: 1F1B, microbatches: {MICROBATCHES}}}
loss: cross_entropy
data: {{format: tensors, path: {rows_file}, val_fraction: 0.0}}
training: {{steps: 1, global_batch_size: {2 * MICROBATCHES}, eval_every: 0, precision: {precision}}}
checkpoint: {{dir: {run}/ckpt}}
output: {{dir: {run}/out}}
""")
        r = subprocess.run([binary, "train", "--config", config, "--nproc", "2"], capture_output=True, text=True)
        text = r.stdout + r.stderr
        missing = [f for f in fragments if f not in text]
        if r.returncode != 1 or missing or os.path.exists(os.path.join(run, "ckpt")):
            problems.append(f"{model}: exit {r.returncode}, missing {missing}:\n{text}")
        else:
            print(f"refused {model}: {text.strip().splitlines()[-1][:200]}...")
    return problems


def main() -> None:
    binary, zoo = sys.argv[1], sys.argv[2]
    only = sys.argv[3:]
    refusals_only = only == ["--refusals"]
    try:
        import torch
        import transformers  # noqa: F401
        import transformers.modeling_outputs  # noqa: F401  (torch.export.load of a ModelOutput program)
    except ImportError as e:
        common.skip(f"{sys.executable} cannot import torch and transformers: {e}")
    torch.set_num_threads(1)
    families = sorted(n[:-5] for n in os.listdir(zoo) if n.endswith(".json"))
    if refusals_only:
        families = []
    elif only:
        families = [f for f in families if f in only]
        unknown = set(only) - set(families) - {"--refusals"}
        if unknown:
            raise SystemExit(f"no such family in {zoo}: {sorted(unknown)}")
    failures = []
    table = []
    with common.temp_dir("pf-hf-train-") as d:
        for name in families:
            with open(os.path.join(zoo, name + ".json")) as f:
                meta = json.load(f)
            data_path = os.path.join(d, name + "_data.pt")
            make_data(torch, meta, data_path)
            initial = hf_model(torch, zoo, name, meta).state_dict()
            for label, layout in LAYOUTS.items():
                if len(layout) > 6 and name not in layout[6]:
                    continue
                start = time.time()
                ref_losses, ref_state = train_eager(torch, zoo, name, meta, data_path, layout)
                losses, state, trained = train_pipeforge(torch, binary, d, zoo, name, meta, data_path, label, layout)
                problems, loss_diff, diff = common.compare_training(torch, losses, ref_losses, state, ref_state,
                                                                    RTOL, ATOL, initial)
                table.append((name, label, loss_diff, diff, not problems))
                print(f"{name:9s} {label:16s} max |loss diff| {loss_diff:.2e}  max |param diff| {diff:.2e}  "
                      f"{time.time() - start:4.1f} s  {'ok' if not problems else 'MISMATCH'}", flush=True)
                failures += [f"{name} {label}: {p}" for p in problems]
                if meta["kind"] == "tokens" and meta["config_class"] == "LlamaConfig" and label == "1F1B":
                    failures += check_generate(torch, binary, d, zoo, name, label, trained)
        long_rows = torch.randint(0, 256, (16, 25), generator=torch.Generator().manual_seed(5))
        torch.save({"inputs": long_rows[:, :-1].contiguous(), "targets": long_rows[:, 1:].contiguous()},
                   os.path.join(d, "long_rows.pt"))
        make_data(torch, {"kind": "tokens", "vocab": 256}, os.path.join(d, "llama_data.pt"))
        if refusals_only or not only:
            failures += check_refusals(binary, d, zoo)
    if table:
        print("\nfamily    layout           max|loss diff| max|param diff|")
    for name, label, loss_diff, diff, ok in table:
        print(f"{name:9s} {label:16s} {loss_diff:14.2e} {diff:15.2e} {'' if ok else ' MISMATCH'}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    if refusals_only:
        print("refused before any rank started, each naming its fix")
    else:
        print(f"pipelined training of {len(families)} transformers families equals eager training "
              f"(rtol {RTOL}, atol {ATOL})")


if __name__ == "__main__":
    main()
