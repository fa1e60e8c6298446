#!/usr/bin/env python3
"""The README demo's model: a stock transformers Llama, random init, exported with torch.export.

A byte-level (256-token) Llama-architecture decoder built from a small
LlamaConfig, with no hub and no weights downloaded: rotary embeddings, RMSNorm,
SwiGLU MLPs and grouped-query attention, exactly as transformers writes them.
It is exported the way a user exports any transformers model,

    torch.export.export(model, (input_ids,), dynamic_shapes=({0: batch, 1: seq},))

in train mode (dropout 0), with the batch and the sequence dynamic, so the same
file trains on 64-byte blocks and samples with a context that grows token by
token. Written atomically; a second run with the same file present does nothing.

Usage: make_demo_llama.py OUT.pt2
"""
import os
import sys
import warnings

import torch

CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, rope_theta=10000.0, attention_dropout=0.0,
              tie_word_embeddings=False, use_cache=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def main() -> None:
    out = sys.argv[1]
    if os.path.exists(out):
        return
    warnings.filterwarnings("ignore")
    import transformers
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).train()
    example = torch.randint(0, CONFIG["vocab_size"], (2, 64))
    batch = torch.export.Dim("batch", min=1, max=1024)
    seq = torch.export.Dim("seq", min=2, max=CONFIG["max_position_embeddings"])
    program = torch.export.export(model, (example,), dynamic_shapes=({0: batch, 1: seq},))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    # torch.export.save names the archive's root folder after the file: save
    # under the final name in a side folder, then rename.
    side = os.path.join(os.path.dirname(os.path.abspath(out)), ".tmp-demo")
    os.makedirs(side, exist_ok=True)
    tmp = os.path.join(side, os.path.basename(out))
    torch.export.save(program, tmp)
    os.replace(tmp, out)
    os.rmdir(side)
    params = sum(p.numel() for p in model.parameters())
    print(f"exported a transformers {model.__class__.__name__} ({params / 1e3:.0f}k parameters, "
          f"{CONFIG['num_hidden_layers']} layers) to {out}")


if __name__ == "__main__":
    main()
