#!/usr/bin/env python3
"""Stock transformers models split by Pipeforge chain to exactly the exported program (issue 23).

For every family of the transformers zoo (tests/models/generate_hf_zoo.py), the
program exactly as torch.export saved it (a ModelOutput, rotary embeddings
under torch.no_grad(), dynamic batch and sequence) is split twice:
  * at a block boundary: `<middle block>: BEGINNING` (model.layers.2,
    transformer.h.2, encoder.layer.2, ...);
  * by the parameters policy into 4 stages.
The stage files, loaded with torch.export.load(path).module() and chained as
pipe.json says, must equal torch.export.load(NAME.pt2).module() on the export's
own sizes and on other sizes its dynamic ranges allow (max |diff| <= 1e-5), and
hold their parameters under the model's own FQNs.

Usage: test_hf_stages_in_python.py PIPEFORGE_BINARY HF_ZOO_DIR [FAMILY ...]
"""
import json
import os
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True

TOLERANCE = 1e-5
SKIP = 77


def chain(stage_dir: str, manifest: dict, inputs: list, torch) -> list:
    outputs = []
    for stage in manifest["stages"]:
        module = torch.export.load(os.path.join(stage_dir, stage["file"])).module()
        args = [inputs[s["index"]] if s["from"] == "input" else outputs[s["stage"]][s["index"]]
                for s in stage["inputs"]]
        result = module(*args)
        assert isinstance(result, tuple) and len(result) == stage["num_outputs"], stage["file"]
        outputs.append(result)
    return [inputs[o["index"]] if o["from"] == "input" else outputs[o["stage"]][o["index"]]
            for o in manifest["outputs"]]


def inputs_for(torch, meta: dict, rows: int, seq: int) -> list:
    g = torch.Generator().manual_seed(rows * 100 + seq)
    if meta["kind"] == "image":
        return [torch.randn(rows, *meta["image"], generator=g)]
    ids = torch.randint(0, meta["vocab"], (rows, seq), generator=g)
    if meta["kind"] == "seq2seq":
        return [ids, torch.randint(0, meta["vocab"], (rows, max(2, seq - 5)), generator=g)]
    return [ids]


def first_output(out):
    if hasattr(out, "logits"):
        return out.logits
    return out[0] if isinstance(out, (tuple, list)) else out


def main() -> None:
    binary, zoo = sys.argv[1], sys.argv[2]
    only = sys.argv[3:]
    try:
        import torch
        import transformers.modeling_outputs  # noqa: F401  (torch.export.load of a ModelOutput program)
    except ImportError as e:
        print(f"SKIP: {sys.executable} cannot import torch and transformers: {e}")
        sys.exit(SKIP)
    torch.set_num_threads(1)
    families = sorted(n[:-5] for n in os.listdir(zoo) if n.endswith(".json"))
    if only:
        families = [f for f in families if f in only]
    failures = []
    with tempfile.TemporaryDirectory(prefix="pf-hf-split-") as d:
        for name in families:
            with open(os.path.join(zoo, name + ".json")) as f:
                meta = json.load(f)
            model_path = os.path.join(zoo, name + ".pt2")
            program = torch.export.load(model_path).module()
            blocks = meta["blocks"]
            middle = blocks[len(blocks) // 2]
            specs = {f"{middle}: BEGINNING": f"split_points:\n  {middle}: BEGINNING\n",
                     "4 stages, parameters": "num_stages: 4\npolicy: parameters\n"}
            for label, spec in specs.items():
                out = os.path.join(d, f"{name}-{len(os.listdir(d))}")
                spec_path = out + ".yaml"
                with open(spec_path, "w") as f:
                    f.write(spec)
                r = subprocess.run([binary, "split", model_path, "--spec", spec_path, "--out", out],
                                   capture_output=True, text=True)
                if r.returncode != 0:
                    failures.append(f"{name} [{label}]: split exited {r.returncode}: {r.stdout}{r.stderr}")
                    continue
                with open(os.path.join(out, "pipe.json")) as f:
                    manifest = json.load(f)
                state = program.state_dict()
                held = set()
                for stage in manifest["stages"]:
                    m = torch.export.load(os.path.join(out, stage["file"])).module()
                    for k, v in m.state_dict().items():
                        if k not in state or not torch.equal(v, state[k]):
                            failures.append(f"{name} [{label}]: {stage['file']} holds '{k}', not the model's")
                        held.add(k)
                missing = set(program.state_dict()) - held - {n for g in manifest["tied"] for n in g}
                if missing:
                    failures.append(f"{name} [{label}]: no stage holds {sorted(missing)[:3]}")
                worst = 0.0
                sizes = [(2, 16), (3, 7)] if meta["kind"] != "image" else [(2, 0), (5, 0)]
                for rows, seq in sizes:
                    xs = inputs_for(torch, meta, rows, seq)
                    with torch.no_grad():
                        if meta["kind"] == "seq2seq":
                            want = first_output(program(xs[0], decoder_input_ids=xs[1]))
                        else:
                            want = first_output(program(*xs))
                        got = chain(out, manifest, xs, torch)[0]
                    diff = (got - want).abs().max().item() if got.shape == want.shape else float("inf")
                    worst = max(worst, diff)
                ok = worst <= TOLERANCE
                print(f"{name:9s} {label:28s} {manifest['num_stages']} stages  max |diff| {worst:.2e}  "
                      f"{'ok' if ok else 'MISMATCH'}", flush=True)
                if not ok:
                    failures.append(f"{name} [{label}]: chained stages differ from the program by {worst:.3g}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print(f"{len(families)} transformers families: chained stage files equal the exported program "
          f"(<= {TOLERANCE})")


if __name__ == "__main__":
    main()
