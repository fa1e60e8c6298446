#!/usr/bin/python3
"""Scripts and saves Pipeforge's test model zoo, with reference outputs.

Run with Debian's /usr/bin/python3 (torch 1.13). Deterministic: every model is
built under a fixed seed, so the same script always writes the same weights.
The output folder is cached by a content hash of this script and its
arguments: a second run with nothing changed does no work.

For each model NAME it writes:
  NAME.pt      the scripted (or traced) module
  NAME.ref.pt  a scripted holder module whose attributes `inputs` and
               `outputs` (lists of tensors) are fixed inputs and the model's
               outputs on them (a TorchScript archive, so C++ reads it with
               torch::jit::load; torch.save's pickles are not all readable there)
"""
import argparse
import hashlib
import math
import os
import sys
from typing import Dict, List, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from pipeforge import pipe_split  # noqa: E402


# (a) The seed example from PyTorch's pipelining guide.
class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x)


class LMHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(3, 3)

    def forward(self, x):
        return self.proj(x)


class SeedExample(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 3)
        self.layers = nn.ModuleList(Layer() for _ in range(2))
        self.lm = LMHead()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.emb(x)
        for layer in self.layers:
            x = layer(x)
        x = self.lm(x)
        return x


# (b) An MLP stack with functional ops between submodule calls.
class MLPBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class MLP(nn.Module):
    def __init__(self, in_features: int = 8, width: int = 16, depth: int = 6, out_features: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(in_features, width)
        self.blocks = nn.ModuleList(MLPBlock(width) for _ in range(depth))
        self.out = nn.Linear(width, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.inp(x))
        for block in self.blocks:
            h = h + F.relu(block(h))
        return self.out(h)


# (c) A GPT-style decoder with a tied LM head.
class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, block_size: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.register_buffer("causal_mask", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.qkv(x).split(C, dim=2)
        hs = C // self.n_head
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(self.causal_mask[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class GPTMLP(nn.Module):
    def __init__(self, n_embd: int) -> None:
        super().__init__()
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, block_size: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = GPTMLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, vocab: int, n_layer: int, n_embd: int, n_head: int, block_size: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, block_size) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one tensor, two FQNs
        # GPT-2's initialisation (std 0.02): with PyTorch's N(0, 1) embedding
        # the tied head starts with logits so large that the first loss is ~40.
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.size(1)
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# (c') The same GPT with dropout on the embeddings and on every residual
# branch: the activation checkpointing tests train it with dropout active, so
# a recompute must replay the forward's masks exactly.
class DropoutBlock(Block):
    def __init__(self, n_embd: int, n_head: int, block_size: int, p: float) -> None:
        super().__init__(n_embd, n_head, block_size)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        x = x + self.drop(self.attn(self.ln_1(x)))
        x = x + self.drop(self.mlp(self.ln_2(x)))
        return x


class DropoutGPT(GPT):
    def __init__(self, vocab: int, n_layer: int, n_embd: int, n_head: int, block_size: int, p: float = 0.2) -> None:
        super().__init__(vocab, n_layer, n_embd, n_head, block_size)
        self.blocks = nn.ModuleList(DropoutBlock(n_embd, n_head, block_size, p) for _ in range(n_layer))
        self.drop = nn.Dropout(p)
        for module in self.blocks.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.size(1)
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# (d) pipe_split() markers at top level and inside a submodule.
class MarkedPair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(6, 6)
        self.second = nn.Linear(6, 6)

    def forward(self, x):
        x = torch.tanh(self.first(x))
        pipe_split()
        return self.second(x)


class Markers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(6, 6)
        self.pair = MarkedPair()
        self.tail = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.head(x))
        pipe_split()
        x = self.pair(x)
        pipe_split()
        pipe_split()  # consecutive markers collapse into one split
        return self.tail(x)


# (e) Several inputs and outputs, an integer mask, a skip used two stages later.
class MultiIO(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc_x = nn.Linear(8, 8)
        self.enc_y = nn.Linear(8, 8)
        self.mid = nn.Linear(8, 8)
        self.deep = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)
        self.aux = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        skip = torch.relu(self.enc_x(x))
        h = skip * mask.to(skip.dtype) + self.enc_y(y)
        h = torch.tanh(self.mid(h))
        h = torch.relu(self.deep(h))
        out = self.head(h + skip)  # `skip` crosses two stage boundaries
        aux = self.aux(h).squeeze(-1)
        return out, aux


class Reference(nn.Module):
    """Holds reference tensors as attributes of a scripted module."""
    inputs: List[torch.Tensor]
    outputs: List[torch.Tensor]

    def __init__(self, inputs: List[torch.Tensor], outputs: List[torch.Tensor]) -> None:
        super().__init__()
        self.inputs = inputs
        self.outputs = outputs

    def forward(self) -> int:
        return len(self.outputs)


# (f) A submodule called inside a loop: control flow stays whole, so a split
# point at `block` must be refused.
class LoopModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 4)
        self.block = nn.Linear(4, 4)
        self.out = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, steps: int = 3) -> torch.Tensor:
        x = self.inp(x)
        for _ in range(steps):
            x = torch.relu(self.block(x))
        return self.out(x)


# (g) Mutable state across a cut (issue 12): lists, dicts and buffers that one
# stage changes in place and a later stage reads.
class ListAcrossCut(nn.Module):
    """FPN-style: features appended to a list on both sides of a cut, then concatenated."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(6, 6)
        self.blocks = nn.ModuleList(nn.Linear(6, 6) for _ in range(4))
        self.head = nn.Linear(6, 3)
        self.proj = nn.Linear(24, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats: List[torch.Tensor] = []
        h = torch.relu(self.stem(x))
        for block in self.blocks:
            h = torch.tanh(block(h))
            feats.append(h)
        return self.head(h) + self.proj(torch.cat(feats, dim=1))


class ListGrownLater(nn.Module):
    """A list made in one stage, changed in the next (append, insert, pop) and read in the one after."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(5, 5)
        self.b = nn.Linear(5, 5)
        self.c = nn.Linear(5, 5)
        self.d = nn.Linear(5, 5)
        self.head = nn.Linear(5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        outs = [y, torch.sigmoid(y)]
        z = self.b(y)
        outs.append(z)
        outs.insert(0, self.c(z))
        w = outs.pop()
        h = self.d(w)
        return self.head(h + torch.stack(outs).sum(0))


class DictAcrossCut(nn.Module):
    """Dict items set on both sides of a cut, one overwritten, then read."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.c = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d: Dict[str, torch.Tensor] = {}
        d["a"] = self.a(x)
        d["b"] = torch.relu(d["a"])
        h = self.b(d["b"])
        d["a"] = h
        d["c"] = self.c(h)
        return d["a"] * 2 + d["b"] + torch.stack(list(d.values())).sum(0)


class Counter(nn.Module):
    """Counts its calls in a buffer, changed in place."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(1))
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(1)
        return self.lin(x)


class BufferAcrossCut(nn.Module):
    """`counter.count` changed in place in stage 0 (inside the call) and read in stage 1."""

    def __init__(self) -> None:
        super().__init__()
        self.counter = Counter()
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.counter(x)
        h = self.body(h)
        return self.head(h) * self.counter.count


class BufferWithinStage(nn.Module):
    """`counter.count` changed and read in stage 0 only."""

    def __init__(self) -> None:
        super().__init__()
        self.counter = Counter()
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.counter(x) * self.counter.count
        h = self.body(h)
        return self.head(h)


class BufferReadBeforeWrite(nn.Module):
    """`counter.count` read in stage 0, changed in stage 1: the next forward of stage 0 would need it back."""

    def __init__(self) -> None:
        super().__init__()
        self.counter = Counter()
        self.stem = nn.Linear(4, 4)
        self.body = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x) * self.counter.count
        h = self.body(h)
        return self.counter(h)


class SharedNorm(nn.Module):
    """One BatchNorm called in two stages: both would update their own running statistics."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(4)
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.a(x))
        return self.norm(self.b(h))


class ListInLoop(nn.Module):
    """A list appended to in a loop before a cut: its length is unknown when splitting."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows: List[torch.Tensor] = []
        h = self.a(x)
        for i in range(h.size(0)):
            rows.append(h[i] * 2)
        g = self.b(h)
        return g + torch.stack(rows)


GPT_TEST = dict(vocab=64, n_embd=16, n_head=2, block_size=16)
class UnusedState(nn.Module):
    """A parameter pair and a buffer that forward never reads: no stage holds them."""

    def __init__(self) -> None:
        super().__init__()
        self.lin0 = nn.Linear(4, 4)
        self.lin1 = nn.Linear(4, 4)
        self.aux = nn.Linear(4, 2)
        self.register_buffer("calib", torch.arange(3.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin1(torch.relu(self.lin0(x)))


GPT_DEMO = dict(vocab=256, n_embd=64, n_head=4, block_size=64)


def build(name: str, gpt_layers: int):
    """Returns (module, example inputs, how to save: 'script' | 'trace')."""
    g = torch.Generator().manual_seed(1234)
    if name == "seed_example":
        return SeedExample(), [torch.randint(0, 10, (8, 4), generator=g)], "script"
    if name == "mlp":
        return MLP(), [torch.randn(8, 8, generator=g)], "script"
    if name == "mlp_traced":
        return MLP(), [torch.randn(8, 8, generator=g)], "trace"
    if name == "gpt_dropout":
        model = DropoutGPT(n_layer=gpt_layers, **GPT_TEST)
        return model, [torch.randint(0, GPT_TEST["vocab"], (4, GPT_TEST["block_size"]), generator=g)], "script"
    if name.startswith("gpt"):
        cfg = GPT_DEMO if name.startswith("gpt_demo") else GPT_TEST
        model = GPT(n_layer=gpt_layers, **cfg)
        return model, [torch.randint(0, cfg["vocab"], (4, cfg["block_size"]), generator=g)], "script"
    if name == "markers":
        return Markers(), [torch.randn(4, 6, generator=g)], "script"
    if name == "multi_io":
        return MultiIO(), [torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g),
                           torch.randint(0, 2, (6, 8), generator=g)], "script"
    if name == "loop_model":
        return LoopModel(), [torch.randn(4, 4, generator=g)], "script"
    stateful = {
        "list_across_cut": (ListAcrossCut, (5, 6)),
        "list_grown_later": (ListGrownLater, (3, 5)),
        "dict_across_cut": (DictAcrossCut, (3, 4)),
        "buffer_across_cut": (BufferAcrossCut, (2, 4)),
        "buffer_within_stage": (BufferWithinStage, (2, 4)),
        "buffer_read_before_write": (BufferReadBeforeWrite, (2, 4)),
        "shared_norm": (SharedNorm, (3, 4)),
        "list_in_loop": (ListInLoop, (3, 4)),
        "unused_state": (UnusedState, (2, 4)),
    }
    if name in stateful:
        cls, shape = stateful[name]
        return cls(), [torch.randn(*shape, generator=g)], "script"
    raise SystemExit(f"generate_zoo.py: unknown model '{name}'")


def save_model(name: str, out_dir: str, gpt_layers: int) -> None:
    torch.manual_seed(0)
    model, inputs, how = build(name, gpt_layers)
    model.eval()
    scripted = torch.jit.trace(model, tuple(inputs)) if how == "trace" else torch.jit.script(model)
    # Saved before the reference forward: a model that changes its buffers in
    # forward (a counter) is saved in the state the reference started from.
    path = os.path.join(out_dir, name + ".pt")
    scripted.save(path + ".tmp")
    os.replace(path + ".tmp", path)
    with torch.no_grad():
        outputs = scripted(*inputs)
    if not isinstance(outputs, tuple):
        outputs = (outputs,)
    ref = os.path.join(out_dir, name + ".ref.pt")
    torch.jit.script(Reference(list(inputs), list(outputs))).save(ref + ".tmp")
    os.replace(ref + ".tmp", ref)


DEFAULT_MODELS = ["seed_example", "mlp", "mlp_traced", "gpt", "gpt_dropout", "markers", "multi_io", "loop_model",
                  "gpt_demo",
                  "list_across_cut", "list_grown_later", "dict_across_cut", "buffer_across_cut", "buffer_within_stage",
                  "buffer_read_before_write", "shared_norm", "list_in_loop", "unused_state"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--models", nargs="*", default=DEFAULT_MODELS)
    parser.add_argument("--gpt-layers", type=int, default=2, help="blocks of the 'gpt' model")
    parser.add_argument("--demo-layers", type=int, default=4, help="blocks of the 'gpt_demo' model")
    args = parser.parse_args()

    with open(os.path.abspath(__file__), "rb") as f:
        digest = hashlib.sha256(f.read())
    digest.update(repr((sorted(args.models), args.gpt_layers, args.demo_layers, torch.__version__)).encode())
    stamp = os.path.join(args.out, ".zoo-hash")
    key = digest.hexdigest()
    if os.path.exists(stamp) and open(stamp).read().strip() == key:
        return
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    for name in args.models:
        layers = args.demo_layers if name.startswith("gpt_demo") else args.gpt_layers
        save_model(name, args.out, layers)
    with open(stamp + ".tmp", "w") as f:
        f.write(key + "\n")
    os.replace(stamp + ".tmp", stamp)


if __name__ == "__main__":
    main()
