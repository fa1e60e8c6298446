#!/usr/bin/env python3
"""`pipeforge inspect --depth` on a stock transformers GPT-2 (issue 24, point 12).

The transformers zoo's GPT2LMHeadModel (tests/models/generate_hf_zoo.py: n_embd
32, 4 blocks, dynamic batch and sequence) drawn as modules, not aten ops:
  * at depth 2 there is one node per embedding, the dropout, each block, the
    final norm and the head, in that order, each with its class;
  * the value crossing each cut between blocks is the hidden state,
    float32[batch, seq, n_embd], batch * seq * n_embd * 4 bytes, in text and JSON;
  * the SVG's label boxes keep apart, and text, json, dot and svg exit 0;
  * the module tree names the Dropouts forward calls and says why the one
    it never calls (attn_dropout, under sdpa) has no class;
  * a bad depth exits 1 naming the fix, a non-number exits 2.

Usage: test_hf_module_view.py PIPEFORGE_BINARY HF_ZOO_DIR
"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True
SKIP = 77
BATCH, SEQ = 2, 16


def run(binary: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([binary, "inspect", *args], capture_output=True, text=True)


def label_boxes(svg: str) -> list:
    """Label boxes per node/edge/cluster, as tests/inspect/svg_labels.h measures them."""
    boxes = []
    for g in re.finditer(r'<g id="[^"]*" class="(node|edge|cluster)">([\s\S]*?)</g>', svg):
        x0 = y0 = 1e9
        x1 = y1 = -1e9
        lines = []
        for t in re.finditer(r'<text text-anchor="(start|middle|end)" x="([-0-9.]+)" y="([-0-9.]+)"[^>]*'
                             r'font-size="([0-9.]+)"[^>]*>([^<]*)</text>', g.group(2)):
            anchor, x, y, size, text = t.group(1), float(t.group(2)), float(t.group(3)), float(t.group(4)), t.group(5)
            width = 0.6 * size * len(re.sub(r"&[#a-zA-Z0-9]+;", "_", text))
            left = x if anchor == "start" else x - width / 2 if anchor == "middle" else x - width
            x0, x1 = min(x0, left), max(x1, left + width)
            y0, y1 = min(y0, y - 0.8 * size), max(y1, y + 0.2 * size)
            lines.append(text)
        if lines:
            boxes.append(("|".join(lines), (x0, y0, x1, y1)))
    return boxes


def crowded(boxes: list, gap: float) -> list:
    bad = []
    for i, (ta, a) in enumerate(boxes):
        for tb, b in boxes[i + 1:]:
            if not (a[2] + gap <= b[0] or b[2] + gap <= a[0] or a[3] + gap <= b[1] or b[3] + gap <= a[1]):
                bad.append((ta, tb))
    return bad


def main() -> None:
    binary, zoo = sys.argv[1], sys.argv[2]
    model = os.path.join(zoo, "gpt2.pt2")
    if not os.path.exists(model):
        print(f"SKIP: no {model} (the transformers zoo was not built)")
        sys.exit(SKIP)
    with open(os.path.join(zoo, "gpt2.json")) as f:
        meta = json.load(f)
    n_embd, vocab, blocks = meta["config"]["n_embd"], meta["config"]["vocab_size"], meta["blocks"]
    hidden = f"float32[{BATCH}, {SEQ}, {n_embd}]"
    hidden_bytes = BATCH * SEQ * n_embd * 4
    failures = []

    def check(ok: bool, what: str) -> None:
        if not ok:
            failures.append(what)

    with tempfile.TemporaryDirectory(prefix="pf-hf-module-view-") as d:
        spec = os.path.join(d, "spec.yaml")
        with open(spec, "w") as f:
            f.write(f"example_inputs:\n  - {{shape: [{BATCH}, {SEQ}], dtype: int64, high: {vocab}}}\n")
        base = [model, "--spec", spec, "--depth", "2"]

        r = run(binary, *base, "--format", "json")
        if r.returncode != 0:
            print(f"FAIL: json exited {r.returncode}: {r.stderr}")
            sys.exit(1)
        view = json.loads(r.stdout)
        expected = ["transformer.wte", "transformer.wpe", "transformer.drop", *blocks, "transformer.ln_f", "lm_head"]
        modules = [n["module"] for n in view["nodes"]]
        check(modules == expected, f"nodes {modules}, expected {expected}")
        classes = {n["module"]: n["class"] for n in view["nodes"]}
        check(all(classes.get(b) == "GPT2Block" for b in blocks), f"block classes {classes}")
        check(classes.get("transformer.drop") == "Dropout", f"drop class {classes.get('transformer.drop')}")
        check(view["inputs"] == [{"value": "input_ids", "input": 0, "meta": f"int64[{BATCH}, {SEQ}]",
                                  "bytes": BATCH * SEQ * 8}], f"inputs {view['inputs']}")
        index = {m: i for i, m in enumerate(modules)}
        for block, after in zip(blocks, blocks[1:]):
            cut = view["cuts"][index[block]]
            state = [v for v in cut["values"] if v["value"] == block]
            check(len(state) == 1 and state[0]["meta"] == hidden and state[0]["bytes"] == hidden_bytes
                  and state[0]["last_reader"] == index[after], f"cut after {block}: {cut}")
            check(cut["bytes"] == sum(v["bytes"] for v in cut["values"]), f"cut total {cut}")
        logits = view["outputs"][0]
        check(logits["meta"] == f"float32[{BATCH}, {SEQ}, {vocab}]" and logits["bytes"] == BATCH * SEQ * vocab * 4,
              f"outputs {view['outputs']}")

        r = run(binary, *base)
        check(r.returncode == 0, f"text exited {r.returncode}: {r.stderr}")
        line = f"{blocks[0]}: {hidden} ({hidden_bytes} B)"
        check(line in r.stdout, f"text lacks '{line}':\n{r.stdout}")
        check(f"at depth 2: {len(expected)} nodes" in r.stdout, f"text header:\n{r.stdout[:200]}")

        for fmt in ("dot", "svg"):
            out = os.path.join(d, "modules." + fmt)
            r = run(binary, *base, "--format", fmt, "--out", out)
            check(r.returncode == 0 and r.stdout == "", f"{fmt} exited {r.returncode}: {r.stderr}")
        with open(os.path.join(d, "modules.dot")) as f:
            dot = f.read()
        check(f'[label="{blocks[0]}\\nGPT2Block\\n' in dot, "dot lacks the first block's node")
        with open(os.path.join(d, "modules.svg")) as f:
            boxes = label_boxes(f.read())
        check(sum(1 for text, _ in boxes if text.startswith(blocks[0] + "|" + hidden)) == 1,
              f"svg has no value label for {blocks[0]}")
        check(not crowded(boxes, 4.0), f"svg labels crowd each other: {crowded(boxes, 4.0)[:3]}")
        check(sorted(os.listdir(d)) == ["modules.dot", "modules.svg", "spec.yaml"], f"left behind: {os.listdir(d)}")

    r = run(binary, model)
    check(r.returncode == 0, f"tree exited {r.returncode}: {r.stderr}")
    check("(resid_dropout): Dropout()" in r.stdout, "the tree does not name the Dropouts forward calls")
    check("(attn_dropout): Module()  # forward never calls it, so the .pt2 records no class for it" in r.stdout,
          "the tree does not say why attn_dropout has no class")

    r = run(binary, model, "--depth", "0")
    check(r.returncode == 1 and "--depth 0: the module view needs a depth of 1 or more" in r.stderr,
          f"--depth 0: exit {r.returncode}: {r.stderr}")
    r = run(binary, model, "--depth", "two")
    check(r.returncode == 2, f"--depth two: exit {r.returncode}: {r.stderr}")

    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print(f"ok: GPT-2 at depth 2 is {len(expected)} nodes; blocks pass {hidden} ({hidden_bytes} B)")


if __name__ == "__main__":
    main()
