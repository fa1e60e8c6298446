"""The PyTorch side's stages for a model `pipeline()` cannot split: built by
hand, the way torchtitan does it (issue 45).

torchtitan deep-copies the model for each stage, keeps the decoder layers of
that stage in a ModuleDict keyed by their index (so every parameter keeps
its FQN), sets what the stage does not run (the embedding before the first
stage, the final norm and head after the last) to None, and wraps the rest
in PipelineStage. Its own Transformer's forward skips the None parts;
transformers' LlamaForCausalLM has no such forward, so LlamaStage below is
the few lines a user writes for it: embed (first stage), the rotary
position embeddings, the stage's layers, norm and head (last stage).
"""
import copy
from typing import List

import torch
import torch.nn as nn


class LlamaStage(nn.Module):
    """Decoder layers [begin, end) of a transformers Llama, plus the
    embedding on the first stage and the final norm and head on the last.
    Attention is causal by SDPA's is_causal (no mask is passed)."""

    def __init__(self, model: nn.Module, begin: int, end: int, first: bool, last: bool) -> None:
        super().__init__()
        if model.config._attn_implementation != "sdpa":
            raise ValueError(f"LlamaStage relies on SDPA's causal attention; the model uses "
                             f"{model.config._attn_implementation}")
        m = copy.deepcopy(model)
        m.model.layers = nn.ModuleDict({str(i): m.model.layers[i] for i in range(begin, end)})
        if not first:
            m.model.embed_tokens = None
        if not last:
            m.model.norm = None
            m.lm_head = None
        self.first, self.last = first, last
        # The FQNs of the whole model: model.layers.<i>..., lm_head..., as the weights files name them.
        self.model = m.model
        self.lm_head = m.lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.model.embed_tokens(x) if self.first else x
        positions = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
        rotary = self.model.rotary_emb(h, positions)
        for layer in self.model.layers.values():
            h = layer(h, position_ids=positions, position_embeddings=rotary)
            if isinstance(h, tuple):
                h = h[0]
        if self.last:
            h = self.lm_head(self.model.norm(h))
        return h


def layer_bounds(cuts: List[str], layers: int) -> List[int]:
    """[0, c1, c2, ..., layers] from cuts "model.layers.<c>" (BEGINNING)."""
    bounds = [0]
    for c in cuts:
        if not isinstance(c, str) or not c.startswith("model.layers."):
            raise ValueError(f"a manual Llama split cuts before model.layers.<i>, not at {c}")
        bounds.append(int(c[len("model.layers."):]))
    return bounds + [layers]


def llama_stages(model: nn.Module, cuts: List[str], stages: List[int]) -> List[nn.Module]:
    """The stage modules of `stages` (indexes into the cuts' pieces)."""
    bounds = layer_bounds(cuts, len(model.model.layers))
    last = len(bounds) - 2
    return [LlamaStage(model, bounds[s], bounds[s + 1], s == 0, s == last) for s in stages]
