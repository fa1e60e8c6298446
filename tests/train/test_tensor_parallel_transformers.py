#!/usr/bin/env python3
"""Tensor parallel on transformers Llama and Qwen2 (issue 44): loss parallel, a tied vocabulary, sequence shards.

With tensor parallel, lm_head is split by vocabulary and its logits are left
split; the loss is Megatron's vocab-parallel cross-entropy (Note
[Vocab-parallel cross-entropy] in tensor_parallel/tp_ops.cpp), so no rank
holds [N, V]. Qwen2 ties lm_head to the embedding, in another stage: both
stages split the one weight by vocabulary rows (Note [Tied vocabulary] in
tensor_parallel/tp_plan.cpp). Each family trains four ways on pp2, 4 steps
with a held-out evaluation every 2:
  * tp1 (the reference);
  * pp2 x tp2 with loss_parallel (the default);
  * pp2 x tp2 with loss_parallel: false (lm_head whole on every rank);
  * pp2 x tp2 with sequence_parallel.
and the test checks:
  * per-step training and held-out losses of the tp2 runs equal tp1's
    (rtol 1e-5: the split sums add in another order);
  * with sequence parallel, what crosses the pipeline cut is each rank's
    part of the sequence (Note [Sequence shards across cuts] in
    tensor_parallel/tp_plan.cpp): in the trace (args.bytes of the send
    slices), the hidden states the first stage sends, and their gradients
    the second sends back, are half the bytes of the run without it;
  * the last stage's ranks hold half of lm_head with loss parallel: their
    `model_state` param_bytes are vocab x hidden x 4 / 2 fewer; for Qwen2
    the first stage's ranks too (the tied embedding); for Llama the first
    stage's embedding is split either way;
Llama then checks:
  * `pipeforge eval --outputs` on the tp1 checkpoint gives the same whole
    logits [rows, seq, vocab] on tp2 with loss parallel (gathered once the
    loss is taken) as on tp1, and the same held-out loss;
  * a target outside the vocabulary is refused naming it, as
    torch.nn.functional.cross_entropy refuses it.
and Qwen2:
  * an explicit plan that splits the embedding by vocabulary but names no
    style for lm_head splits one copy of the tied weight and not the other:
    refused before training, naming the tied parameter and the fix.

Usage: test_tensor_parallel_transformers.py PIPEFORGE_BINARY HF_ZOO_DIR
"""
import json
import os
import re
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import interop_common as common  # noqa: E402

STEPS, MICROBATCHES, ROWS_PER_MB, SEED = 4, 4, 3, 7
RTOL, ATOL = 1e-5, 1e-6
SEQ, ROWS = 20, 48
ENV = {"OMP_NUM_THREADS": "1"}
# label -> (tensor parallel, extra pipeline keys)
RUNS = {"tp1": (1, ""), "tp2": (2, ""), "tp2 whole head": (2, ", loss_parallel: false"),
        "tp2 sp": (2, ", sequence_parallel: true")}


def write_config(path, run, model, data, tp, extra):
    """pp2 x tp `tp`, 1F1B, `extra` appended to the pipeline keys."""
    with open(path, "w") as f:
        f.write(f"""model: {{path: {model}, num_stages: 2, policy: parameters}}
pipeline: {{schedule: 1F1B, microbatches: {MICROBATCHES}, tensor_parallel: {tp}{extra}}}
loss: cross_entropy
optimizer: {{name: adamw, lr: 0.001, weight_decay: 0.01, eps: 1.0e-6}}
lr_schedule: {{decay: constant, warmup_steps: 0}}
data: {{format: tensors, path: {data}, val_fraction: 0.25}}
training: {{steps: {STEPS}, global_batch_size: {ROWS_PER_MB * MICROBATCHES}, seed: {SEED}, eval_every: 2, eval_batches: 1}}
checkpoint: {{dir: {run}/ckpt, every: {STEPS}}}
distributed: {{timeout_s: 60}}
output: {{dir: {run}/out, trace: true, trace_steps: 1}}
""")


def held_out(output: str) -> float:
    m = re.search(r"held-out loss (\S+) over", output)
    assert m, f"no held-out loss in:\n{output}"
    return float(m.group(1))


def within(a, b) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= ATOL + RTOL * abs(y) for x, y in zip(a, b))


def largest_sends(run) -> dict:
    """{(rank, 'F' or 'B'): the largest payload that rank sent}, from the run's trace."""
    with open(os.path.join(run, "out", "trace.json")) as f:
        trace = json.load(f)
    out = {}
    for e in trace["traceEvents"] if isinstance(trace, dict) else trace:
        if e.get("cat") == "comm" and "bytes" in e.get("args", {}):
            key = (e["tid"], e["name"].split()[1][1])  # "send 0F3 to rank 2" -> (rank, "F")
            out[key] = max(out.get(key, 0), e["args"]["bytes"])
    return out


def train_four_ways(torch, binary, d, family, model, tokens):
    """The runs of RUNS; returns {label: (losses by event, param_bytes by rank, largest sends)}."""
    data = os.path.join(d, "data.pt")
    torch.save({"inputs": tokens[:, :-1].contiguous(), "targets": tokens[:, 1:].contiguous()}, data)
    results = {}
    for label, (tp, extra) in RUNS.items():
        run = os.path.join(d, label.replace(" ", "-"))
        write_config(run + ".yaml", run, model, data, tp, extra)
        records = common.train_records(binary, run + ".yaml", 2 * tp, os.path.join(run, "out"))
        series = {e: common.losses_of(records, e) for e in ("train", "eval")}
        states = {r["rank"]: r["param_bytes"] for r in records if r["event"] == "model_state"}
        results[label] = (series, states, largest_sends(run))
        print(f"{family:6} {label:15} train {series['train']}  held-out {series['eval']}  param_bytes {states}")
    return results


def check_family(torch, binary, d, family, model) -> list:
    os.makedirs(d)
    with open(os.path.join(os.path.dirname(model), family + ".json")) as f:
        meta = json.load(f)
    vocab, hidden = meta["vocab"], meta["config"]["hidden_size"]
    tied = bool(meta["config"].get("tie_word_embeddings"))
    problems = []
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, vocab, (ROWS, SEQ + 1), generator=g)
    results = train_four_ways(torch, binary, d, family, model, tokens)

    ref = results["tp1"][0]
    for label in ("tp2", "tp2 whole head", "tp2 sp"):
        series = results[label][0]
        for e in ("train", "eval"):
            if len(ref[e]) != (STEPS if e == "train" else STEPS // 2) or not within(series[e], ref[e]):
                problems.append(f"{family} {label}: {e} losses {series[e]} vs tp1 {ref[e]}")
        diff = max(abs(a - b) for a, b in zip(series["train"] + series["eval"], ref["train"] + ref["eval"]))
        print(f"{family} {label}: max |loss diff| to tp1 {diff:.2e}")
    # tp is innermost: ranks 0 and 1 hold the first stage (the embedding), 2 and 3 the last (lm_head).
    whole_sends, shard_sends = results["tp2"][2], results["tp2 sp"][2]
    for key in ((0, "F"), (1, "F"), (2, "B"), (3, "B")):
        print(f"{family} rank {key[0]} largest {key[1]} send: {whole_sends.get(key)} bytes, with sequence parallel "
              f"{shard_sends.get(key)}")
        if not whole_sends.get(key) or 2 * shard_sends.get(key, 0) != whole_sends[key]:
            problems.append(f"{family} rank {key[0]}: the largest {key[1]} send is {shard_sends.get(key)} bytes with "
                            f"sequence parallel, not half of {whole_sends.get(key)}")
    split, whole = results["tp2"][1], results["tp2 whole head"][1]
    half = vocab * hidden * 4 // 2
    for r in (0, 1, 2, 3):
        want = half if r >= 2 or tied else 0
        if whole[r] - split[r] != want:
            problems.append(f"{family} rank {r}: loss parallel holds {split[r]} parameter bytes, the whole head "
                            f"{whole[r]}: {whole[r] - split[r]} fewer, not {want}")
    if tied:
        # The embedding split by an explicit plan, lm_head (named by no glob) whole: the tied copies disagree.
        run = os.path.join(d, "mismatch")
        write_config(run + ".yaml", run, model, os.path.join(d, "data.pt"), 2,
                     ', tensor_parallel_plan: {"model.embed_tokens": vocab, "layers.*.mlp.up_proj": colwise, '
                     '"layers.*.mlp.gate_proj": colwise, "layers.*.mlp.down_proj": rowwise}')
        problems += common.expect_refusal(binary, run + ".yaml", "tied copies split unalike",
                                          ["tied parameter", "lm_head.weight", "set pipeline.loss_parallel: false"],
                                          nproc=4)
        return problems

    # The same checkpoint evaluated on tp1 and on tp2 with loss parallel: whole logits.
    ckpt = os.path.join(d, "tp1", "ckpt")
    outs, losses = {}, {}
    for label, tp in (("tp1", 1), ("tp2", 2)):
        path = os.path.join(d, f"eval-{label}.pt")
        text = common.run_pipeforge(binary, "eval", "--config", os.path.join(d, label + ".yaml"), "--checkpoint",
                                    ckpt, "--outputs", path, "--nproc", str(2 * tp), env=ENV)
        losses[label] = held_out(text)
        outs[label] = torch.load(path)[0]
    print(f"eval outputs: tp1 {tuple(outs['tp1'].shape)}, tp2 {tuple(outs['tp2'].shape)}, max |diff| "
          f"{(outs['tp1'] - outs['tp2']).abs().max().item() if outs['tp1'].shape == outs['tp2'].shape else 'n/a'}"
          f"; held-out loss {losses['tp1']:.9g} vs {losses['tp2']:.9g}")
    if outs["tp2"].shape != (ROWS_PER_MB * MICROBATCHES, SEQ, vocab):
        problems.append(f"eval outputs on tp2 have shape {tuple(outs['tp2'].shape)}, not whole logits")
    elif not torch.allclose(outs["tp2"], outs["tp1"], rtol=RTOL, atol=ATOL):
        problems.append("eval outputs on tp2 differ from tp1's")
    if not within([losses["tp2"]], [losses["tp1"]]):
        problems.append(f"held-out loss on tp2 {losses['tp2']} vs tp1 {losses['tp1']}")

    # A target past the vocabulary: refused by the split loss, naming it.
    bad = tokens[:, 1:].clone()
    bad[5, 3] = vocab
    data = os.path.join(d, "bad.pt")
    torch.save({"inputs": tokens[:, :-1].contiguous(), "targets": bad}, data)
    run = os.path.join(d, "bad-target")
    write_config(run + ".yaml", run, model, data, 2, "")
    problems += common.expect_refusal(binary, run + ".yaml", "a target outside the vocabulary",
                                      [f"target {vocab} is outside the vocabulary [0, {vocab})"], nproc=4)
    return problems


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    binary, zoo = sys.argv[1], sys.argv[2]
    try:
        import torch
    except ImportError:
        common.skip("needs torch in the test's python")
    problems = []
    with common.temp_dir("pf-loss-parallel-") as d:
        for family in ("llama", "qwen2"):
            model = os.path.join(zoo, family + ".pt2")
            if not os.path.exists(model):
                common.skip(f"{model} is not built")
            problems += check_family(torch, binary, os.path.join(d, family), family, model)
    for p in problems:
        print("FAIL:", p)
    if problems:
        return 1
    print("loss parallel, the tied vocabulary and sequence shards train and evaluate as tp1, and refuse what they cannot")
    return 0


if __name__ == "__main__":
    sys.exit(main())
