"""The benchmark's models, their cuts and their data, shared by both sides.

Each model is one eager module class. Pipeforge gets it as TorchScript (the
zoo's `gpt_demo.pt`, or a `.pt` scripted here); PyTorch builds the same class
eagerly and loads that file's state_dict, so both sides start from the same
weights. `cuts(model, num_stages)` are the FQNs both sides split at
(SplitPoint.BEGINNING / `BEGINNING` in a Pipeforge split spec).
"""
import os
import sys
from dataclasses import dataclass, field
from typing import Callable, List, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "models"))
import generate_zoo  # noqa: E402  (GPT, GPT_DEMO: the zoo's own definitions)


# A CIFAR-style ResNet: a stem, 8 basic blocks (BatchNorm after every conv),
# global average pooling and a linear classifier. Cuts go between blocks, so
# one tensor crosses each.
class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = nn.Sequential()
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(h)) + self.down(x))


class ResNet(nn.Module):
    WIDTHS = (16, 16, 32, 32, 64, 64, 128, 128)

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        blocks, cin = [], 16
        for i, w in enumerate(self.WIDTHS):
            blocks.append(BasicBlock(cin, w, 2 if w != cin else 1))
            cin = w
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


@dataclass(frozen=True)
class ModelSpec:
    name: str
    describe: str
    build: Callable[[], nn.Module]  # the eager module (weights replaced by the .pt's)
    zoo_file: str                   # a file of the zoo to use as is; "" = script build() here
    input_shape: Tuple[int, ...]    # one row
    input_kind: str                 # "tokens" | "image"
    vocab: int = 0                  # tokens: id range and classes; image: classes
    units: List[str] = field(default_factory=list)  # FQNs at which a cut may go, in order
    exported: bool = False          # Pipeforge gets a torch.export .pt2 of build(), not TorchScript
    # How the PyTorch side makes its stages: "pipeline" (torch.distributed.pipelining.pipeline() at the
    # cuts) or "manual" (by hand, as torchtitan does: manual_split.py) where pipeline()'s stages fail.
    torch_split: str = "pipeline"


def _gpt_units(layers: int) -> List[str]:
    """Cut points of a GPT: before each block, and inside it before `ln_2`
    (after the attention half), so 4 blocks give 8 stages. Only the residual
    stream crosses either cut."""
    units = []
    for i in range(layers):
        if i > 0:
            units.append(f"blocks.{i}")
        units.append(f"blocks.{i}.ln_2")
    return units


def _gpt(layers: int, **cfg):
    def build() -> nn.Module:
        torch.manual_seed(0)
        return generate_zoo.GPT(n_layer=layers, **cfg)
    return build


GPT24 = dict(vocab=256, n_embd=256, n_head=8, block_size=64)

# A stock transformers Llama (issue 23), random init: 8 decoder layers, d=256,
# 8 heads over 4 KV heads (GQA), SwiGLU MLP, RoPE, RMSNorm, T=64.
LLAMA = dict(vocab_size=256, hidden_size=256, intermediate_size=688, num_hidden_layers=8, num_attention_heads=8,
             num_key_value_heads=4, max_position_embeddings=64, use_cache=False, attention_dropout=0.0)


def _llama() -> nn.Module:
    import transformers
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).train()

MODELS = {
    "gpt_demo": ModelSpec("gpt_demo", "demo GPT: 4 blocks, d=64, T=64 (build/zoo/gpt_demo.pt)",
                          _gpt(4, **generate_zoo.GPT_DEMO), "gpt_demo.pt", (generate_zoo.GPT_DEMO["block_size"],),
                          "tokens", generate_zoo.GPT_DEMO["vocab"], _gpt_units(4)),
    "gpt24": ModelSpec("gpt24", "GPT: 24 blocks, d=256, 8 heads, T=64", _gpt(24, **GPT24), "",
                       (GPT24["block_size"],), "tokens", GPT24["vocab"], _gpt_units(24)),
    "resnet": ModelSpec("resnet", "ResNet: 8 basic blocks with BatchNorm, 3x32x32, 10 classes",
                        lambda: (torch.manual_seed(0), ResNet())[1], "", (3, 32, 32), "image", 10,
                        [f"blocks.{i}" for i in range(1, 8)]),
    "llama": ModelSpec("llama", "transformers LlamaForCausalLM: 8 layers, d=256, 8/4 heads (GQA), T=64, "
                       "torch.export with dynamic batch and sequence", _llama, "", (LLAMA["max_position_embeddings"],),
                       "tokens", LLAMA["vocab_size"], [f"model.layers.{i}" for i in range(1, 8)], exported=True,
                       torch_split="manual"),
}


def cuts(spec: ModelSpec, num_stages: int) -> List[str]:
    """num_stages - 1 cut FQNs spread evenly over the model's cut points.
    GPT: the cut points interleave block and half-block cuts, so an even
    spread of a 24-block GPT into 4 stages cuts before blocks 6, 12 and 18."""
    n = len(spec.units) + 1  # pieces the cut points make
    if n % num_stages != 0:
        raise ValueError(f"{spec.name}: {n} pieces do not divide into {num_stages} equal stages")
    step = n // num_stages
    return [spec.units[k * step - 1] for k in range(1, num_stages)]


def split_points(cuts: list) -> List[Tuple[str, str]]:
    """(FQN, "BEGINNING" | "END") of each cut. A cut is an FQN (a cut at the
    BEGINNING of that module's call) or an [FQN, "END"] pair (after it): the
    cuts read back from a Pipeforge cost split (pipeforge_side.split_cuts)
    can need the latter."""
    return [(c, "BEGINNING") if isinstance(c, str) else (c[0], c[1]) for c in cuts]


def cut_label(cut) -> str:
    return cut if isinstance(cut, str) else f"{cut[0]}:{cut[1]}"


def example_input(spec: ModelSpec, rows: int) -> dict:
    """One microbatch of the model's input for a split spec's `example_inputs`
    (the cost policy times each submodule call on it)."""
    if spec.input_kind == "tokens":
        return {"shape": [rows, *spec.input_shape], "dtype": "int64", "high": spec.vocab}
    return {"shape": [rows, *spec.input_shape], "dtype": "float32"}


def make_model_file(spec: ModelSpec, zoo: str, work: str, precision: str = "fp32") -> str:
    """The file Pipeforge splits: TorchScript, or for an exported model the
    .pt2 a user writes with torch.export (dynamic batch and sequence), with
    the weights beside it as NAME.init.pt for the eager side. For bf16
    training the export runs under torch.autocast(bfloat16), as a user must
    export it: an fp32 export checks dtypes that autocast changes (Note
    [Stale dtype checks] in runtime/pipeline_stage.cpp)."""
    if spec.exported:
        model = spec.build()
        path = os.path.join(work, spec.name + ".pt2")
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, _init_path(path))
        x = torch.randint(0, spec.vocab, (2, 16), generator=torch.Generator().manual_seed(1))
        batch = torch.export.Dim("batch", min=1, max=64)
        seq = torch.export.Dim("seq", min=2, max=spec.input_shape[0])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            program = torch.export.export(model, (x,), dynamic_shapes=({0: batch, 1: seq},))
        torch.export.save(program, path)
        return path
    if spec.zoo_file:
        path = os.path.join(zoo, spec.zoo_file)
        if not os.path.exists(path):
            raise SystemExit(f"{path} is missing: build the zoo first (bash scripts/build.sh, or cmake --build build)")
        return path
    path = os.path.join(work, spec.name + ".pt")
    torch.jit.script(spec.build().train()).save(path)
    return path


def _init_path(model_file: str) -> str:
    return os.path.splitext(model_file)[0] + ".init.pt"


def load_eager(spec: ModelSpec, model_file: str) -> nn.Module:
    """The eager module with the weights and buffers of `model_file`."""
    model = spec.build()
    if spec.exported:
        model.load_state_dict(torch.load(_init_path(model_file)))
    else:
        model.load_state_dict(torch.jit.load(model_file).state_dict())
    return model.train()


def make_data(spec: ModelSpec, rows: int, path: str) -> None:
    """A `data.format: tensors` file: {"inputs", "targets"} of `rows` rows."""
    g = torch.Generator().manual_seed(7)
    if spec.input_kind == "tokens":
        tokens = torch.randint(0, spec.vocab, (rows, spec.input_shape[0] + 1), generator=g)
        data = {"inputs": tokens[:, :-1].contiguous(), "targets": tokens[:, 1:].contiguous()}
    else:
        data = {"inputs": torch.randn(rows, *spec.input_shape, generator=g),
                "targets": torch.randint(0, spec.vocab, (rows,), generator=g)}
    torch.save(data, path)


def loss_fn(output, target):
    """Pipeforge's `loss: cross_entropy`: logits [..., V] against integer targets, ignore_index -1."""
    out = output[0] if isinstance(output, tuple) else getattr(output, "logits", output)
    return F.cross_entropy(out.reshape(-1, out.size(-1)), target.reshape(-1), ignore_index=-1)
