#!/usr/bin/env python3
"""Variable sequence lengths (issue 43): documents of different lengths, one
per row, each microbatch at its own length, equal eager transformers training.

The data is a token stream of documents of 3 to 2 x BLOCK tokens (most short), each ended by
the separator 0. `data.packing: none` makes each one a row, cut at BLOCK + 1
tokens, its inputs padded with the separator and its targets with -1; the
runner cuts every microbatch to its longest row (Note [Variable sequence
lengths] in data/token_dataset.cpp). The same steps run twice:
  * Pipeforge: `pipeforge train --nproc R` of the transformers zoo's Llama
    (`llama.pt2`, exported with dynamic batch and sequence), loss_normalization
    per_token, then `pipeforge export --out trained.pt2`, whose weights go
    back into a transformers LlamaForCausalLM;
  * transformers, one process: the LlamaForCausalLM with the same initial
    weights, on the same documents (this file mirrors the sampler: each
    document once per epoch, in interop_common.epoch_order's order), each
    microbatch padded to its own longest row, the summed cross-entropy of
    every microbatch divided by the tokens counted over the whole batch.
Per-step losses and final weights must agree within rtol 1e-4, atol 1e-5
(float32 along different but equivalent paths), and every step's logged
`seq_lengths` must be the microbatch lengths this file computes (so the cut
happened; at least one below BLOCK, and not all equal). Layouts: 2 ranks 1F1B,
2 ranks ZBVZeroBubble (two stages each), and 2 pipeline ranks x 2
data-parallel replicas.

Usage: test_variable_lengths_match_transformers.py PIPEFORGE_BINARY HF_ZOO_DIR
"""
import json
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import interop_common as common  # noqa: E402

STEPS = 4
MICROBATCHES = 4
ROWS_PER_MB = 3
BLOCK = 16
SEED = 5
SEPARATOR = 0
RTOL, ATOL = 1e-4, 1e-5
# label -> (schedule, pipeline ranks, stages per rank, data parallel)
LAYOUTS = {"1F1B": ("1F1B", 2, 1, 1), "ZBV": ("ZBVZeroBubble", 2, 2, 1), "1F1B x DP2": ("1F1B", 2, 1, 2)}


def write_documents(torch, vocab: int, path: str) -> list:
    """A uint16 stream of 40 documents, each ended by SEPARATOR; returns them (separators included)."""
    g = torch.Generator().manual_seed(9)
    docs, stream = [], []
    for _ in range(40):
        # Mostly short documents, one in five past the block: microbatches of every length.
        long = float(torch.rand((1,), generator=g)) < 0.2
        n = int(torch.randint(BLOCK, 2 * BLOCK + 1, (1,), generator=g)) if long else \
            int(torch.randint(3, BLOCK // 2 + 1, (1,), generator=g))
        doc = torch.randint(1, vocab, (n - 1,), generator=g).tolist() + [SEPARATOR]
        docs.append(doc)
        stream += doc
    import array
    with open(path, "wb") as f:
        array.array("H", stream).tofile(f)  # little endian here, as Pipeforge reads it
    return docs


def global_batch(torch, docs: list, step: int, batch: int):
    """The padded [batch, BLOCK] rows of `step`, as Pipeforge draws them."""
    n = len(docs)
    x = torch.full((batch, BLOCK), SEPARATOR, dtype=torch.long)
    y = torch.full((batch, BLOCK), -1, dtype=torch.long)
    for j in range(batch):
        k = step * batch + j
        doc = docs[common.epoch_order(SEED, k // n, n)[k % n]][:BLOCK + 1]
        x[j, :len(doc) - 1] = torch.tensor(doc[:-1])
        y[j, :len(doc) - 1] = torch.tensor(doc[1:])
    return x, y


def longest(y) -> int:
    cols = (y != -1).any(0).nonzero()
    return max(int(cols.max()) + 1 if cols.numel() else 1, 2)


def train_eager(torch, model, docs: list, dp: int):
    import torch.nn.functional as F
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=False)
    microbatches = MICROBATCHES * dp
    batch = ROWS_PER_MB * microbatches
    losses, lengths = [], []
    for step in range(STEPS):
        x, y = global_batch(torch, docs, step, batch)
        counted = int((y != -1).sum())
        opt.zero_grad(set_to_none=True)
        total, cuts = 0.0, []
        for mb in range(microbatches):
            rows = slice(mb * ROWS_PER_MB, (mb + 1) * ROWS_PER_MB)
            t = longest(y[rows])
            cuts.append(t)
            logits = model(input_ids=x[rows, :t]).logits
            loss_sum = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y[rows, :t].reshape(-1),
                                       ignore_index=-1, reduction="sum")
            (loss_sum / counted).backward()
            total += loss_sum.item() / counted
        opt.step()
        losses.append(total)
        lengths.append(cuts[:MICROBATCHES])  # replica 0's, as rank 0 logs them
    return losses, lengths, {k: v.detach().clone() for k, v in model.state_dict().items()}


def hf_llama(torch, zoo: str):
    import transformers
    with open(os.path.join(zoo, "llama.json")) as f:
        meta = json.load(f)
    config = transformers.LlamaConfig.from_dict(meta["config"])
    config._attn_implementation = meta["attn_implementation"]
    model = transformers.LlamaForCausalLM(config)
    model.load_state_dict(torch.load(os.path.join(zoo, "llama.init.pt")), strict=True)
    return model.train(), meta


def train_pipeforge(torch, binary: str, d: str, zoo: str, data: str, label: str, layout: tuple):
    schedule, pp, per_rank, dp = layout
    run = os.path.join(d, label.replace(" ", ""))
    model_path = os.path.join(zoo, "llama.pt2")
    with open(run + ".yaml", "w") as f:
        f.write(f"""model: {{path: {model_path}, num_stages: {pp * per_rank}, policy: parameters}}
pipeline: {{schedule: {schedule}, microbatches: {MICROBATCHES}, stages_per_rank: {per_rank}, data_parallel: {dp}}}
loss: cross_entropy
loss_normalization: per_token
optimizer: {{name: sgd, lr: 0.1, momentum: 0.9}}
lr_schedule: {{decay: constant, warmup_steps: 0}}
data: {{format: tokens, dtype: uint16, path: {data}, val_fraction: 0.0, block_size: {BLOCK}, packing: none,
        document_separator: {SEPARATOR}}}
training: {{steps: {STEPS}, global_batch_size: {ROWS_PER_MB * MICROBATCHES * dp}, seed: {SEED}, eval_every: 0}}
checkpoint: {{dir: {run}/ckpt}}
distributed: {{timeout_s: 60}}
output: {{dir: {run}/out}}
""")
    out = common.run_pipeforge(binary, "train", "--config", run + ".yaml", "--nproc", str(pp * dp),
                               env={"OMP_NUM_THREADS": "1"})
    trained = os.path.join(run, "trained.pt2")
    common.run_pipeforge(binary, "export", os.path.join(run, "ckpt"), "--model", model_path, "--out", trained)
    with open(os.path.join(run, "out", "metrics.jsonl")) as f:
        records = sorted((json.loads(line) for line in f if '"train"' in line), key=lambda r: r["step"])
    model, _ = hf_llama(torch, zoo)
    model.load_state_dict(torch.export.load(trained).module().state_dict(), strict=True)
    return out, records, {k: v.detach().clone() for k, v in model.state_dict().items()}


def main() -> None:
    binary, zoo = sys.argv[1], sys.argv[2]
    try:
        import torch
        import transformers  # noqa: F401
        import transformers.modeling_outputs  # noqa: F401  (torch.export.load of a ModelOutput program)
    except ImportError as e:
        common.skip(f"{sys.executable} cannot import torch and transformers: {e}")
    torch.set_num_threads(1)
    failures = []
    with common.temp_dir("pf-varlen-") as d:
        initial, meta = hf_llama(torch, zoo)
        initial = {k: v.detach().clone() for k, v in initial.state_dict().items()}
        data = os.path.join(d, "docs.bin")
        docs = write_documents(torch, meta["vocab"], data)
        for label, layout in LAYOUTS.items():
            model, _ = hf_llama(torch, zoo)
            ref_losses, ref_lengths, ref_state = train_eager(torch, model, docs, layout[3])
            out, records, state = train_pipeforge(torch, binary, d, zoo, data, label, layout)
            losses = [r["loss"] for r in records]
            problems, loss_diff, diff = common.compare_training(torch, losses, ref_losses, state, ref_state, RTOL,
                                                                ATOL, initial)
            lengths = [r.get("seq_lengths") for r in records]
            if lengths != ref_lengths:
                problems.append(f"seq_lengths {lengths} vs the microbatches' longest rows {ref_lengths}")
            flat = [t for step in ref_lengths for t in step]
            if not (min(flat) < BLOCK and len(set(flat)) > 1):
                problems.append(f"the data does not vary the lengths ({flat}): the case proves nothing")
            if "one document per row (packing none:" not in out:
                problems.append(f"the run does not say how it reads the data:\n{out}")
            print(f"llama {label:11s} max |loss diff| {loss_diff:.2e}  max |param diff| {diff:.2e}  "
                  f"lengths {lengths[0]} ... {'ok' if not problems else 'MISMATCH'}", flush=True)
            failures += [f"{label}: {p}" for p in problems]
        # A Llama exported with a static sequence length cannot run microbatches of their own lengths.
        run = os.path.join(d, "static")
        with open(run + ".yaml", "w") as f:
            f.write(f"""model: {{path: {os.path.join(zoo, "llama_static.pt2")}, num_stages: 2, policy: parameters}}
pipeline: {{schedule: 1F1B, microbatches: 2}}
data: {{format: tokens, dtype: uint16, path: {data}, val_fraction: 0.0, block_size: 16, packing: none,
        document_separator: {SEPARATOR}}}
training: {{steps: 1, global_batch_size: 4, eval_every: 0}}
output: {{dir: {run}/out}}
""")
        failures += common.expect_refusal(binary, run + ".yaml", "a static sequence length with packing none",
                                          ["exported with a static size of 16 in dimension 1",
                                           "data.packing: none runs each microbatch at its own length",
                                           "dynamic_shapes="])
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print(f"variable-length documents train as eager transformers does (rtol {RTOL}, atol {ATOL})")


if __name__ == "__main__":
    main()
