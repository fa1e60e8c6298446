"""Export a model without its weights: the graph on the meta device, the
buffers its constructor computes in a small safetensors file beside it.

    from pipeforge import export_on_meta
    export_on_meta(lambda: LlamaForCausalLM(config), (input_ids,),
                   dynamic_shapes=({0: batch, 1: seq},), path="llama.pt2")
    # -> llama.pt2 (graph only) and llama.buffers.safetensors

    pipeforge split llama.pt2 --weights CHECKPOINT_DIR --weights llama.buffers.safetensors ...

Why the extra file: torch.export refuses a module whose parameters are on
the meta device while its buffers are real (FakeTensorDeviceMismatchError),
so everything is exported on meta; but non-persistent buffers (transformers'
rotary `inv_freq`) are in no checkpoint, so their values are saved here,
computed on the CPU by the model's own constructor. The parameters are never
materialized: each is moved to meta as the constructor registers it (what
accelerate's init_empty_weights does), so a 70B model exports in seconds and
in little memory.

Tied weights (`lm_head.weight` is `model.embed_tokens.weight` with
tie_word_embeddings) are invisible in a meta export, whose tensors all point
at one empty record; they are recorded in the buffers file's metadata under
"pipeforge.tied_weights", and `pipeforge split` makes them one tensor again,
filling a tied name the checkpoint left out (save_pretrained drops it).
"""
import contextlib
import json
import os

import torch

TIED_WEIGHTS_KEY = "pipeforge.tied_weights"


@contextlib.contextmanager
def _parameters_on_meta():
    original = torch.nn.Module.register_parameter

    def register(module, name, param):
        original(module, name, param)
        p = module._parameters.get(name)
        if p is not None and p.device.type != "meta":
            meta = type(p)(p.to("meta"), requires_grad=p.requires_grad)
            meta.__dict__.update(p.__dict__)
            module._parameters[name] = meta

    torch.nn.Module.register_parameter = register
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original


def _to_meta(value):
    if isinstance(value, torch.Tensor):
        return value.to("meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_to_meta(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_meta(v) for k, v in value.items()}
    return value


def tied_weights(model: torch.nn.Module) -> dict:
    """{name: the first name of the same parameter} for every parameter
    reachable under more than one name."""
    first = {}
    tied = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            tied[name] = first[id(p)]
        else:
            first[id(p)] = name
    return tied


def export_on_meta(build, args, kwargs=None, dynamic_shapes=None, path="model.pt2", buffers_path=None,
                   strict=False):
    """Builds the model with `build()` (parameters on meta, buffers real),
    saves its buffers and ties to `buffers_path` (default: PATH without
    .pt2 + ".buffers.safetensors"), and saves torch.export.export of it,
    all on meta, to `path`. `args`/`kwargs` are example inputs (any device;
    moved to meta). Returns (path, buffers_path)."""
    from safetensors.torch import save_file

    if buffers_path is None:
        root = path[:-4] if path.endswith(".pt2") else path
        buffers_path = root + ".buffers.safetensors"
    with _parameters_on_meta():
        model = build()
    tied = tied_weights(model)
    buffers = {}
    for name, b in model.named_buffers(remove_duplicate=False):
        if b.device.type != "meta":
            buffers[name] = b.detach().clone().contiguous()
    save_file(buffers, buffers_path, metadata={TIED_WEIGHTS_KEY: json.dumps(tied, sort_keys=True)})
    for module in model.modules():
        for name, b in list(module._buffers.items()):
            if b is not None and b.device.type != "meta":
                module._buffers[name] = b.to("meta")
    program = torch.export.export(model, _to_meta(tuple(args)), kwargs=_to_meta(kwargs or {}),
                                  dynamic_shapes=dynamic_shapes, strict=strict)
    tmp = path[:-4] + ".tmp.pt2" if path.endswith(".pt2") else path + ".tmp"
    torch.export.save(program, tmp)
    os.replace(tmp, path)
    return path, buffers_path
