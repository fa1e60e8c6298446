#!/usr/bin/env python3
"""Makes the inputs of the `pt2_json` fuzz target (fuzz/README.md).

Run with the venv's python (torch 2.13), from the repository root:

    .venv/bin/python fuzz/make_pt2_json_seeds.py

Exports one tiny model several ways -- training IR, functional IR with buffer
mutations, a dynamic batch, torch.cond, torch.while_loop, both pipe_split
markers -- and writes

  fuzz/data/pt2_json_base.pt2   the archive each fuzz input is placed in: what
                                torch.export.save wrote, without models/*.json,
                                data/sample_inputs/ and the serialization id
  fuzz/corpus/pt2_json/*.json   the variants' models/model.json, compact, with
                                the stack_trace metadata dropped to keep them small

Every variant has the same parameters, buffers and constants (the checks below
make sure), so each seed's graph signature finds its tensors in the one base
archive: the embedding and the head share one weight (tied), BatchNorm brings
buffers (updated in train mode), and a non-persistent buffer is a constant.
"""
import io
import json
import os
import sys
import zipfile

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
from pipeforge import pipe_split  # noqa: E402
from torch.distributed.pipelining import pipe_split as torch_pipe_split  # noqa: E402


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.norm = nn.BatchNorm1d(4)

    def forward(self, h):
        return torch.relu(self.norm(self.fc(h)))


class Tiny(nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.emb = nn.Embedding(8, 4)
        self.block = Block()
        self.head = nn.Linear(4, 8, bias=False)
        self.head.weight = self.emb.weight  # tied
        self.register_buffer("offset", torch.full((4,), 0.5), persistent=False)

    def forward(self, x):
        h = self.emb(x)
        if self.mode == "cond":
            h = torch.cond(h.sum() > 0, lambda t: self.block.fc(t), lambda t: t * 2.0, (h,))
        if self.mode == "while":
            def cond_fn(i, t):
                return i < 2

            def body_fn(i, t):
                return i + 1, torch.tanh(self.block.fc(t))

            _, h = torch._higher_order_ops.while_loop(cond_fn, body_fn, (torch.zeros((), dtype=torch.int64), h))
        h = self.block(h) + self.offset
        if self.mode == "pippy":
            torch_pipe_split()
        else:
            pipe_split()
        return self.head(h)


VARIANTS = {
    # name: (mode, train, dynamic batch, run_decompositions)
    "train_ir": ("plain", True, False, False),
    "functional": ("plain", True, False, True),
    "eval_dynamic": ("plain", False, True, False),
    "cond": ("cond", False, False, False),
    "while": ("while", False, False, False),
    "pippy_marker": ("pippy", False, False, False),
}


def export(mode: str, train: bool, dynamic: bool, decompose: bool) -> bytes:
    torch.manual_seed(0)
    model = Tiny(mode).train(train)
    x = torch.tensor([1, 2, 3, 4], dtype=torch.int64)
    shapes = ({0: torch.export.Dim("batch", min=2, max=64)},) if dynamic else None
    ep = torch.export.export(model, (x,), dynamic_shapes=shapes)
    if decompose:
        ep = ep.run_decompositions()
    buffer = io.BytesIO()
    torch.export.save(ep, buffer)
    return buffer.getvalue()


def strip(value):
    """Drops the metadata that only helps a human (stack traces), recursively."""
    if isinstance(value, dict):
        return {k: strip(v) for k, v in value.items() if k != "stack_trace"}
    if isinstance(value, list):
        return [strip(v) for v in value]
    return value


def main() -> None:
    corpus = os.path.join(HERE, "corpus", "pt2_json")
    os.makedirs(corpus, exist_ok=True)
    os.makedirs(os.path.join(HERE, "data"), exist_ok=True)
    base_records = None
    for name, (mode, train, dynamic, decompose) in VARIANTS.items():
        with zipfile.ZipFile(io.BytesIO(export(mode, train, dynamic, decompose))) as z:
            records = {}
            for info in z.infolist():
                rel = info.filename.split("/", 1)[1]
                if rel.startswith("models/"):
                    program = json.loads(z.read(info))
                elif not rel.startswith("data/sample_inputs/") and rel != ".data/serialization_id":
                    records[rel] = z.read(info)
        if base_records is None:
            base_records = records
        elif records != base_records:
            sys.exit(f"make_pt2_json_seeds.py: variant '{name}' has other weights or constants than the first; "
                     "keep every variant's parameters, buffers and constants the same")
        text = json.dumps(strip(program), separators=(",", ":"))
        with open(os.path.join(corpus, name + ".json"), "w") as f:
            f.write(text)
        print(f"{name}.json: {len(text)} bytes")
    base = os.path.join(HERE, "data", "pt2_json_base.pt2")
    with zipfile.ZipFile(base, "w", zipfile.ZIP_STORED) as z:
        for rel, data in sorted(base_records.items()):
            z.writestr("archive/" + rel, data)
    print(f"{base}: {os.path.getsize(base)} bytes, records {sorted(base_records)}")


if __name__ == "__main__":
    main()
