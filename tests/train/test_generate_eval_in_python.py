#!/usr/bin/python3
"""`pipeforge generate` and `pipeforge eval` equal the same computation in PyTorch; `pipeforge plot` draws the run.

A byte-level LM (the zoo's gpt_demo: vocabulary 256, position embedding of
64 rows) trains 120 steps on 2 ranks (2 stages, 1F1B) on a small repetitive
text (about 10 s; enough that greedy decoding is not one repeated byte), with a
held-out evaluation at the last step; the checkpoint is exported with `pipeforge
export` and loaded with torch.jit.load. Then:

  * generate, greedy: `--temperature 0` on 1 and 2 ranks prints exactly the
    bytes that argmax decoding of the exported model gives in Python, with the
    context cropped to the last 64 tokens (the prompt is long enough that the
    crop happens); the same from --prompt-tokens (ids in, ids out);
  * generate, seeded top-k: the same seed prints the same bytes twice, another
    seed other bytes, and all of them are the tokens a Python mirror of Note
    [Seeded sampling] (tools/generate.h) draws from the exported model's
    logits;
  * eval: the held-out loss `pipeforge eval` prints (default checkpoint,
    config's 2 ranks; and an explicit step folder) equals the mean
    cross-entropy that Python computes on the exported model over the same
    held-out rows (data/token_dataset.cpp's sampler mirrored with
    interop_common's draws), each batch cut into the same microbatches,
    relative tolerance 1e-5 (float32 along different but equivalent paths);
    with eval_batches it equals the run's own "eval" event, and with 2
    data-parallel replicas (4 ranks) the same loss (same tolerance);
  * eval --outputs: the saved outputs (one tensor per model output over every
    held-out row, on 2 ranks and with 2 replicas) equal the exported model's
    on those rows (PyTorch's return_outputs);
  * plot: the run's metrics.jsonl becomes an SVG with the train loss line;
  * refusals: exit 1 with a message naming the problem and the fix.

Measured differences are printed. Usage: test_generate_eval_in_python.py PIPEFORGE_BINARY ZOO_DIR
"""
import codecs
import json
import math
import os
import re
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import interop_common as common  # noqa: E402

RTOL = 1e-5
SEED = 11
BLOCK = 32        # data.block_size of training and eval (the model takes up to 64)
# generate's default context is the length the run trained on (BLOCK), not
# gpt_demo's 64-row position embedding (Note [Block size] in tools/generate.cpp).
BATCH, MICROBATCHES = 8, 2
VAL_FRACTION = 0.2
TOKENS = 24
STEPS = 120
GENERATE_STREAM = 0x67656E  # tools/generate.cpp kGenerateStream

TEXT = "".join(f"Line {i}: the quick brown fox jumps over the lazy dog; pipelines split models into stages.\n"
               for i in range(60)).encode()
PROMPT = b"Line 7: the quick brown fox jumps over the lazy dog; pipelines spl"  # 66 bytes > BLOCK: cropped


def run(binary, *args, expect=0):
    r = subprocess.run([binary, *args], capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if r.returncode != expect:
        raise AssertionError(f"pipeforge {' '.join(args)} exited {r.returncode}, expected {expect}:\n"
                             f"{r.stdout}{r.stderr}")
    return r.stdout + r.stderr


def generated_bytes(output: str) -> bytes:
    m = re.search(r'^continuation: "(.*)"$', output, re.M)
    assert m, f"no continuation line in:\n{output}"
    return codecs.escape_decode(m.group(1).encode())[0]


def logits_of(torch, model, ids):
    context = ids[-BLOCK:]
    with torch.no_grad():
        return model(torch.tensor([context], dtype=torch.long))[0, -1].double().tolist()


def python_greedy(torch, model, prompt: bytes, n: int) -> bytes:
    ids = list(prompt)
    for _ in range(n):
        logits = logits_of(torch, model, ids)
        ids.append(max(range(len(logits)), key=lambda i: (logits[i], -i)))
    return bytes(ids[len(prompt):])


def python_sampled(torch, model, prompt: bytes, n: int, temperature: float, top_k: int, seed: int) -> bytes:
    """Note [Seeded sampling] in tools/generate.h, step by step."""
    ids = list(prompt)
    for index in range(n):
        logits = logits_of(torch, model, ids)
        kept = list(range(len(logits)))
        if 0 < top_k < len(logits):
            kept = sorted(sorted(kept, key=lambda i: -logits[i])[:top_k])  # stable: lower ids win ties
        peak = max(logits[i] for i in kept)
        weights = [math.exp((logits[i] - peak) / temperature) for i in kept]
        total = sum(weights)
        u = (common._draw_bits(seed, GENERATE_STREAM, index, 0) >> 11) * 2.0 ** -53
        cumulative, pick = 0.0, kept[-1]
        for i, w in zip(kept, weights):
            cumulative += w / total
            if u < cumulative:
                pick = i
                break
        ids.append(pick)
    return bytes(ids[len(prompt):])


def held_out_rows(tokens: bytes, k: int, batch: int):
    """Held-out batch k of data/token_dataset.cpp: random windows of the last val_fraction of the bytes."""
    held = int(len(tokens) * VAL_FRACTION)
    span = tokens[len(tokens) - held:]
    windows = len(span) - BLOCK
    xs, ys = [], []
    for row in range(batch):
        start = common._draw_below(common._draw_bits(SEED, 1, k, row), windows)
        xs.append(list(span[start:start + BLOCK]))
        ys.append(list(span[start + 1:start + BLOCK + 1]))
    return xs, ys


def python_eval(torch, model, tokens: bytes, batches: int) -> list:
    import torch.nn.functional as F
    losses = []
    for k in range(batches):
        xs, ys = held_out_rows(tokens, k, BATCH)
        x, y = torch.tensor(xs), torch.tensor(ys)
        rows = BATCH // MICROBATCHES
        total = 0.0
        with torch.no_grad():
            for mb in range(MICROBATCHES):
                part = slice(mb * rows, (mb + 1) * rows)
                out = model(x[part])
                total += F.cross_entropy(out.reshape(-1, out.size(-1)), y[part].reshape(-1)).item()
        losses.append(total / MICROBATCHES)
    return losses


def printed_loss(output: str) -> float:
    m = re.search(r"held-out loss (\S+) over", output)
    assert m, f"no loss in:\n{output}"
    return float(m.group(1))


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def main() -> None:
    binary, zoo = sys.argv[1], sys.argv[2]
    try:
        import torch
    except ImportError as e:
        common.skip(f"no torch in {sys.executable}: {e}")
    torch.set_num_threads(1)
    failures = []
    model_path = os.path.join(zoo, "gpt_demo.pt")
    with common.temp_dir("pf-generate-") as d:
        data = os.path.join(d, "text.txt")
        with open(data, "wb") as f:
            f.write(TEXT)
        config = os.path.join(d, "train.yaml")
        with open(config, "w") as f:
            f.write(f"""model: {{path: {model_path}, num_stages: 2, policy: parameters}}
pipeline: {{schedule: 1F1B, microbatches: {MICROBATCHES}}}
loss: cross_entropy
optimizer: {{name: adamw, lr: 0.01}}
lr_schedule: {{decay: constant}}
data: {{format: text, path: {data}, block_size: {BLOCK}, val_fraction: {VAL_FRACTION}}}
training: {{steps: {STEPS}, global_batch_size: {BATCH}, seed: {SEED}, eval_every: {STEPS}, eval_batches: 2}}
checkpoint: {{dir: {d}/ckpt}}
output: {{dir: {d}/out}}
""")
        run(binary, "train", "--config", config, "--nproc", "2")
        trained = os.path.join(d, "trained.pt")
        run(binary, "export", os.path.join(d, "ckpt"), "--model", model_path, "--out", trained)
        model = torch.jit.load(trained)
        model.eval()

        # --- generate, greedy -------------------------------------------------
        expected = python_greedy(torch, model, PROMPT, TOKENS)
        for nproc in ("1", "2"):
            out = run(binary, "generate", os.path.join(d, "ckpt"), "--model", model_path, "--prompt", PROMPT.decode(),
                      "--tokens", str(TOKENS), "--temperature", "0", "--nproc", nproc)
            got = generated_bytes(out)
            same = got == expected
            print(f"generate greedy, {nproc} rank(s): {got!r} {'== Python' if same else f'!= Python {expected!r}'}")
            if not same:
                failures.append(f"greedy on {nproc} ranks: {got!r} vs Python {expected!r}")
            if f"block size {BLOCK}" not in out or f"context: at most {BLOCK} tokens (the run's data.block_size)" \
                    not in out:
                failures.append(f"greedy on {nproc} ranks does not report the run's block size {BLOCK}:\n{out}")

        # Token ids in, token ids out: the same greedy continuation.
        out = run(binary, "generate", os.path.join(d, "ckpt"), "--model", model_path, "--prompt-tokens",
                  ",".join(str(b) for b in PROMPT), "--tokens", str(TOKENS), "--temperature", "0")
        m = re.search(r"^continuation: \[(.*)\]$", out, re.M)
        ids = [int(v) for v in m.group(1).split(", ")] if m else None
        if ids != list(expected):
            failures.append(f"greedy from --prompt-tokens: {ids} vs Python {list(expected)}:\n{out}")
        else:
            print("generate greedy from --prompt-tokens (checkpoint's 2 ranks): the same ids")

        # --- generate, seeded top-k -------------------------------------------
        def sampled(seed, nproc="2"):
            return generated_bytes(run(binary, "generate", os.path.join(d, "ckpt"), "--model", model_path,
                                       "--prompt", PROMPT.decode(), "--tokens", str(TOKENS), "--temperature", "1.5",
                                       "--top-k", "20", "--seed", str(seed), "--nproc", nproc))
        a, b, c = sampled(5), sampled(5, "1"), sampled(6)
        mirror5 = python_sampled(torch, model, PROMPT, TOKENS, 1.5, 20, 5)
        mirror6 = python_sampled(torch, model, PROMPT, TOKENS, 1.5, 20, 6)
        print(f"generate top-k 20, seed 5: {a!r} (1 rank {'same' if a == b else 'DIFFERENT'}); seed 6: {c!r}")
        if a != b:
            failures.append(f"seed 5 gave {a!r} on 2 ranks but {b!r} on 1")
        if a == c:
            failures.append(f"seeds 5 and 6 gave the same {a!r}")
        if a != mirror5 or c != mirror6:
            failures.append(f"sampling differs from the Python mirror: {a!r} vs {mirror5!r}, {c!r} vs {mirror6!r}")
        else:
            print("generate top-k: both seeds equal the Python mirror of Note [Seeded sampling]")

        # --- eval -------------------------------------------------------------
        ref = python_eval(torch, model, TEXT, 3)
        ref_mean = sum(ref) / len(ref)
        out = run(binary, "eval", "--config", config, "--batches", "3")
        got = printed_loss(out)
        print(f"eval (config's 2 ranks, 3 batches): {got:.9g} vs Python {ref_mean:.9g}, rel diff {rel(got, ref_mean):.2e}")
        if rel(got, ref_mean) > RTOL:
            failures.append(f"eval loss {got} vs Python {ref_mean}")
        per_batch = [float(v) for v in re.findall(r"^  batch \d+: (\S+)$", out, re.M)]
        if len(per_batch) != 3 or any(rel(g, r) > RTOL for g, r in zip(per_batch, ref)):
            failures.append(f"eval per batch {per_batch} vs Python {ref}")
        step_dir = os.path.join(d, "ckpt", f"step_{STEPS:08d}")
        out = run(binary, "eval", "--config", config, "--checkpoint", step_dir, "--batches", "2", "--nproc", "2")
        if f"step {STEPS} of" not in out:
            failures.append(f"eval of {step_dir} does not name step {STEPS}:\n{out}")
        got2 = printed_loss(out)
        with open(os.path.join(d, "out", "metrics.jsonl")) as f:
            evals = [json.loads(line) for line in f if '"eval"' in line]
        run_eval = evals[-1]["loss"]
        ref2 = sum(ref[:2]) / 2
        print(f"eval ({step_dir}, 2 batches): {got2:.9g}; the run's eval event {run_eval:.9g}; Python {ref2:.9g}; "
              f"rel diffs {rel(got2, run_eval):.2e}, {rel(got2, ref2):.2e}")
        if rel(got2, run_eval) > RTOL or rel(got2, ref2) > RTOL:
            failures.append(f"eval 2 batches {got2} vs run {run_eval} vs Python {ref2}")

        # Note [Evaluating on other ranks]: the 2-stage run evaluated on 1 rank
        # (the model split again, the weights loaded by name): the same loss.
        out = run(binary, "eval", "--config", config, "--batches", "3", "--nproc", "1")
        got = printed_loss(out)
        print(f"eval (the 2-stage run on 1 rank, 3 batches): {got:.9g} vs Python {ref_mean:.9g}, rel diff "
              f"{rel(got, ref_mean):.2e}")
        if rel(got, ref_mean) > RTOL or "1 rank)" not in out:
            failures.append(f"eval --nproc 1: {got} vs Python {ref_mean}:\n{out}")

        # Two data-parallel replicas of the 2-stage pipeline (4 ranks): each
        # evaluates half the rows; the mean over replicas is the same loss.
        dp_config = os.path.join(d, "train_dp.yaml")
        with open(config) as f, open(dp_config, "w") as g:
            g.write(f.read().replace(f"microbatches: {MICROBATCHES}}}", f"microbatches: {MICROBATCHES}, data_parallel: 2}}"))
        out = run(binary, "eval", "--config", dp_config, "--batches", "3")
        got = printed_loss(out)
        print(f"eval (2 stages x 2 replicas, 3 batches): {got:.9g} vs Python {ref_mean:.9g}, rel diff "
              f"{rel(got, ref_mean):.2e}")
        if rel(got, ref_mean) > RTOL or "4 ranks" not in out:
            failures.append(f"data-parallel eval: {out}")

        # Outputs (PyTorch's return_outputs, Megatron's collect_non_loss_data):
        # `--outputs` saves one tensor per model output over every held-out row,
        # in order, microbatches, replicas and batches merged along dim 0.
        with torch.no_grad():
            want = torch.cat([model(torch.tensor(held_out_rows(TEXT, k, BATCH)[0])) for k in range(3)])
        for label, cfg in (("2 ranks", config), ("2 stages x 2 replicas", dp_config)):
            path = os.path.join(d, f"outputs-{label.replace(' ', '_')}.pt")
            out = run(binary, "eval", "--config", cfg, "--batches", "3", "--outputs", path)
            got = torch.load(path)
            ok = (isinstance(got, tuple) and len(got) == 1 and got[0].shape == want.shape
                  and torch.allclose(got[0], want, rtol=RTOL, atol=1e-5))
            diff = (got[0] - want).abs().max().item() if ok else float("nan")
            print(f"eval --outputs ({label}): {tuple(got[0].shape) if got else None} vs Python {tuple(want.shape)}, "
                  f"max |diff| {diff:.2e}")
            if not ok or f"outputs: {path}" not in out:
                failures.append(f"eval --outputs ({label}): {out}")
        # A merge spec (PyTorch's output_merge_spec): `replicate` keeps the
        # first microbatch's output, dim 1 joins the microbatches along the sequence.
        rows = BATCH // MICROBATCHES
        first = torch.tensor(held_out_rows(TEXT, 0, BATCH)[0])
        with torch.no_grad():
            per_mb = [model(first[m * rows:(m + 1) * rows]) for m in range(MICROBATCHES)]
        for spec, expected in (("[replicate]", per_mb[0]), ("[1]", torch.cat(per_mb, 1))):
            path = os.path.join(d, f"outputs-spec-{spec.strip('[]')}.pt")
            out = run(binary, "eval", "--config", config, "--batches", "1", "--outputs", path,
                      "--set", f"pipeline.output_chunks={spec}")
            got = torch.load(path)[0]
            ok = got.shape == expected.shape and torch.allclose(got, expected, rtol=RTOL, atol=1e-5)
            print(f"eval --outputs with pipeline.output_chunks={spec}: {tuple(got.shape)} "
                  f"{'== Python' if ok else 'MISMATCH'}")
            if not ok:
                failures.append(f"output_chunks {spec}: {tuple(got.shape)} vs {tuple(expected.shape)}: {out}")
        out = run(binary, "eval", "--config", config, "--outputs", os.path.join(d, "o.pt"),
                  "--set", "pipeline.output_chunks=[0, 0]", expect=1)
        if "pipeline.output_chunks gives 2 entries but model" not in out or "has 1 outputs" not in out:
            failures.append(f"output_chunks of the wrong length: {out}")
        out = run(binary, "eval", "--config", config, "--outputs", os.path.join(d, "missing", "o.pt"), expect=1)
        if "--outputs" not in out or "does not exist" not in out:
            failures.append(f"eval --outputs into a missing folder: {out}")

        # --- plot -------------------------------------------------------------
        svg = os.path.join(d, "loss.svg")
        run(binary, "plot", os.path.join(d, "out", "metrics.jsonl"), "--svg", svg)
        with open(svg) as f:
            text = f.read()
        m = re.search(r'data-series="train loss"[^>]* points="([^"]*)"', text)
        if not text.startswith("<svg") or not m or len(m.group(1).split()) != STEPS or ">Loss</text>" not in text:
            failures.append(f"plot of the run: {text[:300]}")
        else:
            print(f"plot: {len(text)} bytes, {STEPS} train loss points, the first {m.group(1).split()[:3]}")

        # --- refusals ---------------------------------------------------------
        ckpt = os.path.join(d, "ckpt")
        gen = ["generate", ckpt, "--model", model_path, "--tokens", "4"]
        cases = [
            (gen + ["--prompt-tokens", "1,300"], 1, ["id 300 (position 1) is outside the model's vocabulary of 256"]),
            (gen + ["--prompt-tokens", "1,x"], 1, ["'x' is not a token id"]),
            (gen + ["--prompt", ""], 1, ["the prompt is empty"]),
            (gen + ["--prompt", "ab", "--block-size", "100"], 1,
             ["--block-size 100 is longer than the model's position embedding (64 positions)"]),
            (gen + ["--prompt", "ab", "--temperature", "-1"], 1, ["--temperature -1: give a number >= 0"]),
            (gen + ["--prompt", "ab", "--prompt-tokens", "1"], 2, ["excludes"]),
            (["generate", os.path.join(d, "nope"), "--model", model_path, "--prompt", "a", "--tokens", "1"], 1,
             ["checkpoint", "does not exist"]),
            (["eval", "--config", config, "--batches", "0"], 1, ["--batches 0: give a number of held-out batches >= 1"]),
            (["eval", "--config", config, "--nproc", "3"], 1,
             ["pipeline.schedule 1F1B with 3 pipeline ranks", "at least as many microbatches as stages"]),
            (["eval", "--config", dp_config, "--nproc", "3"], 1,
             ["--nproc 3 cannot hold pipeline.data_parallel 2 replicas; give a multiple of 2"]),
            (["plot", os.path.join(d, "none.jsonl"), "--svg", svg], 1, ["cannot open metrics log", "none.jsonl"]),
            (["plot", config, "--svg", os.path.join(d, "bad.svg")], 1, ["train.yaml:1: not JSON"]),
        ]
        for args, code, fragments in cases:
            r = subprocess.run([binary, *args], capture_output=True, text=True)
            text = r.stdout + r.stderr
            missing = [f for f in fragments if f not in text]
            if r.returncode != code or missing:
                failures.append(f"pipeforge {' '.join(args)}: exit {r.returncode} (expected {code}), missing {missing}:"
                                f"\n{text}")
            else:
                print(f"refused: {text.strip().splitlines()[0][:160]}")
        if os.path.exists(os.path.join(d, "bad.svg")):
            failures.append("a failed plot left bad.svg behind")
    if failures:
        print("FAILED:\n" + "\n".join(failures))
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
