#!/usr/bin/env python3
"""Every fix a message suggests works: apply it, and the command succeeds (issue 39).

One small byte-level GPT of the zoo (vocabulary 256, position embedding of 64
rows) is exported with torch.export with a dynamic batch (2..8 rows) and a
dynamic sequence (2..16 tokens), so both dimensions have a maximum below what
the data or the command asks. For each mistake, `pipeforge` must exit 1 before
any rank starts, with a message naming the limit and a fix; the test then
applies exactly the fix the message names and expects exit 0:

  * data.block_size above the sequence maximum (item 3): "set data.block_size
    to at most 16";
  * a microbatch above the batch maximum (item 3): "set
    training.global_batch_size to at most 16";
  * a microbatch below the batch minimum: "to at least 4";
  * a text file read as data.format: tokens (item 10): refused before any rank
    starts, naming the token id, the embedding and its rows, and
    "data.format: text";
  * `generate --block-size 40` on a model exported for at most 16 tokens (item
    11): refused naming 16, where it used to print "at most 40 tokens" and run
    with 16; then `--block-size 16`.

Also `pipeforge split` of the .pt2 with example_inputs records their shapes and
what crosses the cut in pipe.json, as a TorchScript split does (item 5), and
`inspect` shows them; and a model whose logits are [batch, vocabulary] is
refused by `generate` naming its 2 sizes, not 3 (item 6).

Usage: test_suggested_fixes.py PIPEFORGE_BINARY
"""
import json
import os
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "interop"))
sys.path.insert(0, os.path.join(HERE, "..", "models"))
import interop_common as common  # noqa: E402

SEQ_MAX, BATCH_MAX, BATCH_MIN = 16, 8, 2
MICROBATCHES = 2


def run(binary: str, *args: str):
    r = subprocess.run([binary, *args], capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return r.returncode, r.stdout + r.stderr


def export_models(torch, d: str):
    import generate_zoo as zoo
    torch.manual_seed(0)
    gpt = zoo.GPT(n_layer=2, vocab=256, n_embd=32, n_head=2, block_size=64).train()
    x = torch.randint(0, 256, (4, 8))
    batch = torch.export.Dim("batch", min=BATCH_MIN, max=BATCH_MAX)
    seq = torch.export.Dim("seq", min=2, max=SEQ_MAX)
    path = os.path.join(d, "gpt.pt2")
    torch.export.save(torch.export.export(gpt, (x,), dynamic_shapes=({0: batch, 1: seq},)), path)

    class LastToken(zoo.GPT):
        """The same GPT (the same FQNs) returning the last position's logits only: [batch, vocabulary]."""
        def forward(self, idx):
            return super().forward(idx)[:, -1, :]

    last_model = LastToken(n_layer=2, vocab=256, n_embd=32, n_head=2, block_size=64).train()
    last_model.load_state_dict(gpt.state_dict())
    last = os.path.join(d, "last_token.pt2")
    torch.export.save(torch.export.export(last_model, (x,), dynamic_shapes=({0: batch, 1: seq},)), last)
    return path, last


def write_config(d: str, name: str, model: str, data: str, fmt: str, block: int, batch: int) -> str:
    config = os.path.join(d, name + ".yaml")
    with open(config, "w") as f:
        f.write(f"""model: {{path: {model}, num_stages: 2, policy: parameters}}
pipeline: {{schedule: 1F1B, microbatches: {MICROBATCHES}}}
loss: cross_entropy
optimizer: {{name: sgd, lr: 0.01}}
data: {{format: {fmt}, path: {data}, block_size: {block}, val_fraction: 0.1}}
training: {{steps: 1, global_batch_size: {batch}, eval_every: 0}}
checkpoint: {{dir: {d}/{name}/ckpt}}
output: {{dir: {d}/{name}}}
""")
    return config


def refused_then_fixed(binary: str, label: str, refused_args: list, fragments: list, fixed_args: list) -> list:
    """The command exits 1 before any rank starts naming `fragments`; with the fix it exits 0."""
    problems = []
    code, text = run(binary, *refused_args)
    missing = [f for f in fragments if f not in text]
    if code != 1 or missing or "rank 0" in text or "Traceback" in text:
        problems.append(f"{label}: exit {code} (want 1), missing {missing}, before any rank: {'rank 0' not in text}:"
                        f"\n{text}")
    else:
        print(f"{label}: refused: {text.strip().splitlines()[-1][:220]}")
    code, text = run(binary, *fixed_args)
    if code != 0:
        problems.append(f"{label}: the suggested fix failed (exit {code}):\n{text}")
    else:
        print(f"{label}: the suggested fix works")
    return problems


def main() -> None:
    binary = sys.argv[1]
    try:
        import torch
    except ImportError:
        common.skip("no torch")
    if not hasattr(torch, "export") or not hasattr(torch.export, "save"):
        common.skip(f"torch {torch.__version__} has no torch.export")
    torch.set_num_threads(1)
    problems = []
    with common.temp_dir("pf-fixes-") as d:
        gpt, last_token = export_models(torch, d)
        tokens = os.path.join(d, "tokens.bin")
        torch.randint(0, 256, (4000,), dtype=torch.int32).to(torch.int16).numpy().tofile(tokens)  # uint16 ids < 256
        text = os.path.join(d, "text.txt")
        with open(text, "w") as f:
            f.write("Pipelines split a model into stages; each rank runs its own. " * 80)

        # Item 3: the sequence above the export's maximum.
        c = write_config(d, "block", gpt, tokens, "tokens", 32, 8)
        problems += refused_then_fixed(
            binary, "data.block_size 32 > seq max 16", ["train", "--config", c, "--nproc", "2"],
            ["sizes 2..16 in dimension 1 (the sequence)", "data.block_size is 32",
             "the export caps the sequence at 16 tokens", "set data.block_size to at most 16"],
            ["train", "--config", c, "--nproc", "2", "--set", "data.block_size=16"])
        # Item 3: the batch above and below the export's range.
        c = write_config(d, "batch_max", gpt, tokens, "tokens", 16, 40)
        problems += refused_then_fixed(
            binary, "20-row microbatches > batch max 8", ["train", "--config", c, "--nproc", "2"],
            ["sizes 2..8 in dimension 0 (the batch)", "caps a microbatch at 8 rows",
             "set training.global_batch_size to at most 16"],
            ["train", "--config", c, "--nproc", "2", "--set", "training.global_batch_size=16"])
        c = write_config(d, "batch_min", gpt, tokens, "tokens", 16, 2)
        problems += refused_then_fixed(
            binary, "1-row microbatches < batch min 2", ["train", "--config", c, "--nproc", "2"],
            ["sizes 2..8 in dimension 0 (the batch)", "set training.global_batch_size to at least 4"],
            ["train", "--config", c, "--nproc", "2", "--set", "training.global_batch_size=4"])
        # Item 10: a text file read as uint16 token ids.
        c = write_config(d, "text", gpt, text, "tokens", 16, 8)
        problems += refused_then_fixed(
            binary, "text read as tokens", ["train", "--config", c, "--nproc", "2"],
            ["holds token id", "read as data.format: tokens", "indexes embedding 'wte', which has 256 rows",
             "set data.format: text"],
            ["train", "--config", c, "--nproc", "2", "--set", "data.format=text"])
        # Item 10: a split from before input_embeddings existed (no pre-check):
        # the failure inside stage 0 is printed once, as the stage's program's.
        stages, two = os.path.join(d, "old_split"), os.path.join(d, "two.yaml")
        with open(two, "w") as f:
            f.write("num_stages: 2\npolicy: parameters\n")
        run(binary, "split", gpt, "--spec", two, "--out", stages)
        with open(os.path.join(stages, "pipe.json")) as f:
            pipe = json.load(f)
        pipe.pop("input_embeddings", None)
        with open(os.path.join(stages, "pipe.json"), "w") as f:
            json.dump(pipe, f)
        c = write_config(d, "old_split", gpt, text, "tokens", 16, 8)
        with open(c) as f:
            yaml = f.read().replace(f"path: {gpt}, num_stages: 2, policy: parameters", f"split_dir: {stages}")
        with open(c, "w") as f:
            f.write(yaml)
        code, out = run(binary, "train", "--config", c, "--nproc", "2")
        wanted = ["in the stage's program at `", "index out of range in self",
                  "stopped because rank 0 at step 0 (action 0F0) failed (that rank's error is printed above or below)"]
        missing = [w for w in wanted if w not in out]
        if code != 1 or missing or out.count("index out of range") != 1 or "TorchScript" in out:
            problems.append(f"a failure inside a .pt2 stage: exit {code}, missing {missing}, printed "
                            f"{out.count('index out of range')} times:\n{out}")
        else:
            print("a failure inside a .pt2 stage is printed once: " +
                  next(line for line in out.splitlines() if "index out of range" in line)[:200])

        # Item 11: generate's --block-size past the export's maximum.
        ckpt = os.path.join(d, "text", "ckpt")
        problems += refused_then_fixed(
            binary, "generate --block-size 40 > seq max 16",
            ["generate", ckpt, "--model", gpt, "--prompt", "Pipelines", "--tokens", "4", "--block-size", "40"],
            ["--block-size 40 is longer than the longest sequence", "(16 tokens in dimension 1 of 'idx')",
             "give --block-size 16 or less"],
            ["generate", ckpt, "--model", gpt, "--prompt", "Pipelines", "--tokens", "4", "--block-size", "16"])

        # Item 6: logits of 2 dimensions are described with 2 sizes.
        code, out = run(binary, "generate", ckpt, "--model", last_token, "--prompt", "Pipelines", "--tokens", "2")
        if code != 1 or "has 2 dimensions (sizes [2, 256]) for 2 row(s)" not in out or "256, 0" in out:
            problems.append(f"generate on [batch, vocabulary] logits: exit {code}:\n{out}")
        else:
            print("generate on [batch, vocabulary] logits: " + out.strip().splitlines()[-1][:200])

        # Item 5: a .pt2 split records the example inputs' shapes, and what crosses each cut.
        spec = os.path.join(d, "spec.yaml")
        with open(spec, "w") as f:
            f.write("num_stages: 2\npolicy: parameters\nexample_inputs:\n  - {shape: [4, 16], dtype: int64, high: 256}\n")
        stages = os.path.join(d, "stages")
        code, out = run(binary, "split", gpt, "--spec", spec, "--out", stages)
        with open(os.path.join(stages, "pipe.json")) as f:
            pipe = json.load(f)
        metas = [s.get("output_meta") for s in pipe["stages"]]
        if code != 0 or pipe.get("input_meta") != ["int64[4, 16]"] or metas[1] != ["float32[4, 16, 256]"] \
                or not metas[0] or not all(m.startswith("float32[4, 16") for m in metas[0]):
            problems.append(f"split of a .pt2 with example_inputs: exit {code}, input_meta "
                            f"{pipe.get('input_meta')}, output_meta {metas}:\n{out}")
        else:
            code, shown = run(binary, "inspect", stages)
            if code != 0 or "int64[4, 16]" not in shown or "give the split spec example_inputs" in shown:
                problems.append(f"inspect of a .pt2 split with example_inputs: exit {code}:\n{shown}")
            else:
                print(f"split of a .pt2 records example shapes: input_meta {pipe['input_meta']}, outputs {metas}")
    if problems:
        print("FAILED:\n  " + "\n  ".join(problems))
        sys.exit(1)
    print("every suggested fix works")


if __name__ == "__main__":
    main()
