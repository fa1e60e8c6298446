#!/usr/bin/env python3
"""Exports Pipeforge's PT2 test zoo (torch.export `.pt2`), with reference data.

Run with the venv's python (torch 2.13), the torch whose LibTorch Pipeforge
links. Deterministic: every model is built under a fixed seed. The output
folder is cached by a content hash of this script, generate_zoo.py (whose
model classes it reuses), the pipe_split helper, its arguments and the torch
version: a second run with nothing changed does no work.

For each model NAME it writes:
  NAME.pt2     torch.export.save(torch.export.export(model, inputs))
  NAME.ref.pt  a scripted holder module (read in C++ with torch::jit::load)
               with the attributes
                 inputs, outputs             fixed inputs and the model's outputs
                 state_names, state_values   the state_dict before the forward
                 after_names, after_values   the buffers after that forward
                                             (BatchNorm in train mode updates them)
  regions.pt2  a torch.no_grad() region calling a submodule and a bfloat16
               torch.autocast region (wrap_with_set_grad_enabled, wrap_with_autocast)
and, for the reader's error tests, files that are wrong in one way each:
  bad_truncated.pt2        the first half of gpt.pt2
  bad_schema.pt2           markers.pt2 with schema_version.major = 999
  bad_archive_version.pt2  markers.pt2 with archive_version = 7
  bad_unknown_op.pt2       calls pf_zoo::mystery, a custom op only Python knows
  bad_non_tensor_out.pt2   forward returns (Tensor, int)
  bad_aoti.pt2             an AOTInductor package's layout: data/aotinductor/ and
                           no models/*.json (hand-made: aoti_compile_and_package
                           works here but takes ~100 s for one Linear on 2 cores)
  legacy_flat.pt2          markers.pt2 rewritten as the torch 2.1-2.7 flat zip

BatchNorm (resnet_train / resnet_eval): Pipeforge trains the stages it splits,
so the main ResNet is exported in TRAIN mode: the graph keeps
`batch_norm(..., training=True)` and in-place updates of the running stats
(training IR, no buffer_mutation outputs), which is what a training stage must
do. resnet_eval is the same network exported after .eval(): running stats are
read, not written. resnet_functional is resnet_train after run_decompositions():
core ATen ops, and the new running stats leave the graph as buffer_mutation
outputs, which the importer writes back with aten::copy_ where they are made. The export bakes the mode in; module.train()/eval() on the
imported model does not change it.
"""
import argparse
import hashlib
import json
import os
import sys
import zipfile
from typing import List

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.join(HERE, "..", "..", "python")
sys.path.insert(0, HERE)
sys.path.insert(0, PYTHON_DIR)
import generate_zoo as zoo  # noqa: E402
from pipeforge import pipe_split  # noqa: E402
from torch.distributed.pipelining import pipe_split as torch_pipe_split  # noqa: E402


class ReferencePT2(nn.Module):
    """Reference tensors as attributes of a scripted module."""
    inputs: List[torch.Tensor]
    outputs: List[torch.Tensor]
    state_names: List[str]
    state_values: List[torch.Tensor]
    after_names: List[str]
    after_values: List[torch.Tensor]

    def __init__(self, inputs, outputs, state, after) -> None:
        super().__init__()
        self.inputs = inputs
        self.outputs = outputs
        self.state_names = list(state.keys())
        self.state_values = list(state.values())
        self.after_names = list(after.keys())
        self.after_values = list(after.values())

    def forward(self) -> int:
        return len(self.outputs)


# Both markers: ours (pipeforge::pipe_split) and PyTorch's (pippy::_pipe_split),
# at top level and inside a submodule; two consecutive ones make one cut.
class MixedMarkedPair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(6, 6)
        self.second = nn.Linear(6, 6)

    def forward(self, x):
        x = torch.tanh(self.first(x))
        torch_pipe_split()
        return self.second(x)


class DeepMultiIO(nn.Module):
    """The zoo's multi-input skip model with a deeper body: enough module calls
    for 8 stages, and `skip` crosses every cut between the encoder and the head."""

    def __init__(self) -> None:
        super().__init__()
        self.enc_x = nn.Linear(8, 8)
        self.enc_y = nn.Linear(8, 8)
        self.body = nn.ModuleList(nn.Linear(8, 8) for _ in range(6))
        self.head = nn.Linear(8, 3)
        self.aux = nn.Linear(8, 1)

    def forward(self, x, y, mask):
        skip = torch.relu(self.enc_x(x))
        h = skip * mask.to(skip.dtype) + self.enc_y(y)
        for layer in self.body:
            h = torch.tanh(layer(h))
        return self.head(h + skip), self.aux(h).squeeze(-1)


class MixedMarkers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(6, 6)
        self.pair = MixedMarkedPair()
        self.tail = nn.Linear(6, 2)

    def forward(self, x):
        x = torch.relu(self.head(x))
        pipe_split()
        x = self.pair(x)
        torch_pipe_split()
        pipe_split()  # consecutive markers make one cut
        return self.tail(x)


# A small ResNet: BasicBlocks with BatchNorm and a downsampling shortcut.
class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return F.relu(out + identity)


class SmallResNet(nn.Module):
    def __init__(self, classes: int = 5) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.layer1 = nn.Sequential(BasicBlock(8, 8, 1), BasicBlock(8, 8, 1))
        self.layer2 = nn.Sequential(BasicBlock(8, 16, 2), BasicBlock(16, 16, 1))
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# torch.cond: a higher-order op the importer keeps whole.
class CondModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 4)
        self.pos = nn.Linear(4, 4)
        self.neg = nn.Linear(4, 4)
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        h = self.inp(x)
        h = torch.cond(h.sum() > 0, lambda t: torch.relu(self.pos(t)), lambda t: torch.tanh(self.neg(t)), (h,))
        return self.out(h)


# For bad_unknown_op: a custom op that exists only in this Python process.
@torch.library.custom_op("pf_zoo::mystery", mutates_args=())
def _mystery(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_mystery.register_fake
def _(x):
    return torch.empty_like(x)


class UnknownOpModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return torch.ops.pf_zoo.mystery(self.lin(x))


# torch.while_loop: a higher-order op the importer turns into a prim::Loop;
# its body calls `step`, so a split point at `step` must be refused.
class WhileModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 4)
        self.step = nn.Linear(4, 4)
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        def cond_fn(i, h):
            return i < 3

        def body_fn(i, h):
            return i + 1, torch.tanh(self.step(h))

        start = torch.zeros((), dtype=torch.int64)
        _, h = torch._higher_order_ops.while_loop(cond_fn, body_fn, (start, self.inp(x)))
        return self.out(h)


# `with torch.no_grad()` and `with torch.autocast(...)` in forward: the
# training IR keeps them as the higher-order ops wrap_with_set_grad_enabled and
# wrap_with_autocast (Note [PT2 regions]). The no-grad region calls `gate`, so
# gate gets no gradient; `cast` runs in bfloat16 and trains.
class RegionsModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(4, 4)
        self.main = nn.Linear(4, 4)
        self.cast = nn.Linear(4, 4)
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        with torch.no_grad():
            scale = torch.sigmoid(self.gate(x))
        h = self.main(x) * scale
        with torch.autocast("cpu", dtype=torch.bfloat16):
            c = self.cast(h)
        return self.out(c.float() + h)


class NonTensorOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x), x.shape[0]


def build(name: str):
    """Returns (module, export inputs, reference inputs, dynamic_shapes, train mode)."""
    g = torch.Generator().manual_seed(1234)
    if name == "gpt":
        cfg = zoo.GPT_TEST
        x = torch.randint(0, cfg["vocab"], (4, cfg["block_size"]), generator=g)
        return zoo.GPT(n_layer=2, **cfg), [x], [x], None, False
    if name == "gpt_dynamic":
        # Dynamic batch: exported with batch 4, checked with batch 3.
        cfg = zoo.GPT_TEST
        x = torch.randint(0, cfg["vocab"], (4, cfg["block_size"]), generator=g)
        ref = torch.randint(0, cfg["vocab"], (3, cfg["block_size"]), generator=g)
        batch = torch.export.Dim("batch", min=2, max=64)
        return zoo.GPT(n_layer=2, **cfg), [x], [ref], ({0: batch},), False
    if name == "multi_io":
        inputs = [torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g),
                  torch.randint(0, 2, (6, 8), generator=g)]
        return zoo.MultiIO(), inputs, inputs, None, False
    if name == "multi_io_deep":
        inputs = [torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g),
                  torch.randint(0, 2, (6, 8), generator=g)]
        return DeepMultiIO(), inputs, inputs, None, False
    if name == "markers":
        x = torch.randn(4, 6, generator=g)
        return MixedMarkers(), [x], [x], None, False
    if name in ("resnet_train", "resnet_eval"):
        x = torch.randn(4, 3, 8, 8, generator=g)
        return SmallResNet(), [x], [x], None, name == "resnet_train"
    if name == "cond_model":
        x = torch.randn(3, 4, generator=g)
        return CondModel(), [x], [x], None, False
    if name == "bad_unknown_op":
        x = torch.randn(2, 4, generator=g)
        return UnknownOpModel(), [x], [x], None, False
    if name == "resnet_functional":
        # Same as resnet_train, then run_decompositions(): the core-ATen,
        # functional IR whose BatchNorm returns new running stats as
        # buffer_mutation outputs instead of updating them in place.
        x = torch.randn(4, 3, 8, 8, generator=g)
        return SmallResNet(), [x], [x], None, True
    if name == "while_model":
        x = torch.randn(3, 4, generator=g)
        return WhileModel(), [x], [x], None, False
    if name == "regions":
        x = torch.randn(6, 4, generator=g)
        return RegionsModel(), [x], [x], None, True
    if name == "bad_non_tensor_out":
        x = torch.randn(2, 4, generator=g)
        return NonTensorOutput(), [x], [x], None, False
    raise SystemExit(f"generate_pt2_zoo.py: unknown model '{name}'")


def _replace(path: str, write) -> None:
    """Writes `path` atomically. The temporary file has the same base name in a
    side folder, because torch.export.save names the archive's root folder after
    the file (`gpt.pt2` -> `gpt/`)."""
    tmp_dir = os.path.join(os.path.dirname(path), ".tmp")
    os.makedirs(tmp_dir, exist_ok=True)
    tmp = os.path.join(tmp_dir, os.path.basename(path))
    write(tmp)
    os.replace(tmp, path)


def save_model(name: str, out_dir: str) -> None:
    torch.manual_seed(0)
    model, inputs, ref_inputs, dynamic_shapes, train = build(name)
    model.train(train)
    ep = torch.export.export(model, tuple(inputs), dynamic_shapes=dynamic_shapes)
    if name == "resnet_functional":
        ep = ep.run_decompositions()
    path = os.path.join(out_dir, name + ".pt2")
    _replace(path, lambda p: torch.export.save(ep, p))
    if name.startswith("bad_"):
        return
    state = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=False).items()}
    with torch.no_grad():
        outputs = model(*ref_inputs)
    if not isinstance(outputs, tuple):
        outputs = (outputs,)
    after = {k: v.detach().clone() for k, v in model.named_buffers()}
    holder = torch.jit.script(ReferencePT2(list(ref_inputs), list(outputs), state, after))
    _replace(os.path.join(out_dir, name + ".ref.pt"), holder.save)


def _rewrite_zip(src: str, dst: str, edit) -> None:
    """Copies zip `src` to `dst`, passing each (name, bytes) through `edit`."""
    def write(tmp):
        with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as zout:
            for info in zin.infolist():
                item = edit(info.filename, zin.read(info.filename))
                if item is not None:
                    zout.writestr(item[0], item[1])
    _replace(dst, write)


def save_bad_files(out_dir: str) -> None:
    gpt = open(os.path.join(out_dir, "gpt.pt2"), "rb").read()
    _replace(os.path.join(out_dir, "bad_truncated.pt2"), lambda p: open(p, "wb").write(gpt[: len(gpt) // 2]))
    markers = os.path.join(out_dir, "markers.pt2")

    def schema(name, data):
        if name.endswith("models/model.json"):
            doc = json.loads(data)
            doc["schema_version"]["major"] = 999
            data = json.dumps(doc).encode()
        return name, data
    _rewrite_zip(markers, os.path.join(out_dir, "bad_schema.pt2"), schema)
    _rewrite_zip(markers, os.path.join(out_dir, "bad_archive_version.pt2"),
                 lambda n, d: (n, b"7") if n.endswith("/archive_version") else (n, d))

    def aoti(name, data):
        # What aoti_compile_and_package writes (checked with torch 2.13 on CPU):
        # data/aotinductor/model/*.{wrapper,kernel}.cpp, *_metadata.json and
        # *.wrapper.so beside the bookkeeping records; no models/, no weights.
        if "/models/" in name or "/data/" in name and "/.data/" not in name:
            return None
        return name, data
    _rewrite_zip(markers, os.path.join(out_dir, "bad_aoti.pt2"), aoti)
    with zipfile.ZipFile(os.path.join(out_dir, "bad_aoti.pt2"), "a") as z:
        z.writestr("markers/data/aotinductor/model/c0.wrapper.cpp", b"// compiled model")
        z.writestr("markers/data/aotinductor/model/c0.wrapper_metadata.json", b"{}")
        z.writestr("markers/data/aotinductor/model/c0.wrapper.so", b"\x7fELF not really")

    # torch 2.1-2.7's flat zip: top-level JSON, no archive_format, pickled weights.
    def flat(tmp):
        with zipfile.ZipFile(markers) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as zout:
            for info in zin.infolist():
                if info.filename.endswith("models/model.json"):
                    zout.writestr("serialized_exported_program.json", zin.read(info.filename))
            zout.writestr("version", b"8.20")
    _replace(os.path.join(out_dir, "legacy_flat.pt2"), flat)


MODELS = ["gpt", "gpt_dynamic", "multi_io", "multi_io_deep", "markers", "resnet_train", "resnet_eval", "resnet_functional",
          "cond_model", "while_model", "bad_unknown_op", "bad_non_tensor_out", "regions"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output folder")
    args = parser.parse_args()

    digest = hashlib.sha256()
    for source in (os.path.abspath(__file__), os.path.join(HERE, "generate_zoo.py"),
                   os.path.join(PYTHON_DIR, "pipeforge", "__init__.py")):
        with open(source, "rb") as f:
            digest.update(f.read())
    digest.update(repr((MODELS, torch.__version__)).encode())
    stamp = os.path.join(args.out, ".zoo-hash")
    key = digest.hexdigest()
    if os.path.exists(stamp) and open(stamp).read().strip() == key:
        return
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    for name in MODELS:
        save_model(name, args.out)
    save_bad_files(args.out)
    os.rmdir(os.path.join(args.out, ".tmp"))
    with open(stamp + ".tmp", "w") as f:
        f.write(key + "\n")
    os.replace(stamp + ".tmp", stamp)


if __name__ == "__main__":
    main()
