#!/usr/bin/env python3
"""pipeline.loss_parallel (issue 44): the vocab-parallel cross-entropy on a transformers Llama.

With tensor parallel, lm_head is split by vocabulary and its logits are left
split; the loss is Megatron's vocab-parallel cross-entropy (Note
[Vocab-parallel cross-entropy] in tensor_parallel/tp_ops.cpp), so no rank
holds [N, V]. The zoo's Llama trains three ways on pp2, 4 steps with a
held-out evaluation every 2:
  * tp1 (the reference);
  * pp2 x tp2 with loss_parallel (the default);
  * pp2 x tp2 with loss_parallel: false (lm_head whole on every rank).
and the test checks:
  * per-step training and held-out losses of both tp2 runs equal tp1's
    (rtol 1e-5: the split sums add in another order);
  * the last stage's ranks hold half of lm_head with loss parallel: their
    `model_state` param_bytes are vocab x hidden x 4 / 2 fewer;
  * `pipeforge eval --outputs` on the tp1 checkpoint gives the same whole
    logits [rows, seq, vocab] on tp2 with loss parallel (gathered once the
    loss is taken) as on tp1, and the same held-out loss;
  * a target outside the vocabulary is refused naming it, as
    torch.nn.functional.cross_entropy refuses it.

Usage: test_loss_parallel.py PIPEFORGE_BINARY HF_ZOO_DIR
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
RUNS = {"tp1": (1, ""), "tp2": (2, ""), "tp2 whole head": (2, ", loss_parallel: false")}


def write_config(path, run, model, data, tp, extra):
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
output: {{dir: {run}/out}}
""")


def held_out(output: str) -> float:
    m = re.search(r"held-out loss (\S+) over", output)
    assert m, f"no held-out loss in:\n{output}"
    return float(m.group(1))


def within(a, b) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= ATOL + RTOL * abs(y) for x, y in zip(a, b))


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    binary, zoo = sys.argv[1], sys.argv[2]
    try:
        import torch
    except ImportError:
        common.skip("needs torch in the test's python")
    model = os.path.join(zoo, "llama.pt2")
    if not os.path.exists(model):
        common.skip(f"{model} is not built")
    with open(os.path.join(zoo, "llama.json")) as f:
        meta = json.load(f)
    vocab, hidden = meta["vocab"], meta["config"]["hidden_size"]
    problems = []
    with common.temp_dir("pf-loss-parallel-") as d:
        g = torch.Generator().manual_seed(3)
        tokens = torch.randint(0, vocab, (ROWS, SEQ + 1), generator=g)
        data = os.path.join(d, "data.pt")
        torch.save({"inputs": tokens[:, :-1].contiguous(), "targets": tokens[:, 1:].contiguous()}, data)

        results = {}
        for label, (tp, extra) in RUNS.items():
            run = os.path.join(d, label.replace(" ", "-"))
            write_config(run + ".yaml", run, model, data, tp, extra)
            common.run_pipeforge(binary, "train", "--config", run + ".yaml", "--nproc", str(2 * tp), env=ENV)
            with open(os.path.join(run, "out", "metrics.jsonl")) as f:
                records = [json.loads(line) for line in f]
            series = {e: [r["loss"] for r in sorted((r for r in records if r["event"] == e), key=lambda r: r["step"])]
                      for e in ("train", "eval")}
            states = {r["rank"]: r["param_bytes"] for r in records if r["event"] == "model_state"}
            results[label] = (series, states)
            print(f"{label:15} train {series['train']}  held-out {series['eval']}  param_bytes {states}")

        ref = results["tp1"][0]
        for label in ("tp2", "tp2 whole head"):
            series = results[label][0]
            for e in ("train", "eval"):
                if len(ref[e]) != (STEPS if e == "train" else STEPS // 2) or not within(series[e], ref[e]):
                    problems.append(f"{label}: {e} losses {series[e]} vs tp1 {ref[e]}")
            diff = max(abs(a - b) for a, b in zip(series["train"] + series["eval"], ref["train"] + ref["eval"]))
            print(f"{label}: max |loss diff| to tp1 {diff:.2e}")
        # tp is innermost: ranks 2 and 3 hold the last stage, with lm_head.
        split, whole = results["tp2"][1], results["tp2 whole head"][1]
        for r in (2, 3):
            saved = whole[r] - split[r]
            if saved != vocab * hidden * 4 // 2:
                problems.append(f"rank {r}: loss parallel holds {split[r]} parameter bytes, the whole head "
                                f"{whole[r]}: {saved} fewer, not half of lm_head ({vocab * hidden * 4 // 2})")
        for r in (0, 1):
            if split[r] != whole[r]:
                problems.append(f"rank {r} (first stage): {split[r]} vs {whole[r]} parameter bytes")

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
        torch.save({"inputs": tokens[:, :-1].contiguous(), "targets": bad}, data)
        run = os.path.join(d, "bad-target")
        write_config(run + ".yaml", run, model, data, 2, "")
        problems += common.expect_refusal(binary, run + ".yaml", "a target outside the vocabulary",
                                          [f"target {vocab} is outside the vocabulary [0, {vocab})"], nproc=4)

    for p in problems:
        print("FAIL:", p)
    if problems:
        return 1
    print("loss parallel trains, evaluates and refuses as the whole cross-entropy does")
    return 0


if __name__ == "__main__":
    sys.exit(main())
