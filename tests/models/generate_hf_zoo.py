#!/usr/bin/env python3
"""Exports Pipeforge's transformers test zoo: stock models, random init, torch.export.

Run with the venv's python (torch 2.13 and the pinned transformers). No hub:
every model is built from a small config under a fixed seed. The output
folder is cached by a content hash of this script and the torch and
transformers versions: a second run with nothing changed does no work.

For each family NAME (FAMILIES below) it writes:
  NAME.pt2        torch.export.save(torch.export.export(model, inputs,
                  dynamic_shapes=...)) of the model in train mode, exactly as a
                  user exports it: no wrapper, outputs as the model returns them
                  (a ModelOutput), every dimension that can vary made dynamic
                  (batch and sequence; batch only for images)
  NAME.init.pt    the model's state_dict before export (torch.save), so a test
                  can train the transformers model itself from the same weights
  NAME.json       how to rebuild it: {"family", "config_class", "model_class",
                  "config": config.to_dict(), "inputs": [names], "kind":
                  "tokens" | "seq2seq" | "image", "vocab", "image": [C, H, W],
                  "labels", "blocks": [FQN of every repeated block, in order],
                  "attn_implementation", "gradient_checkpointing", "tp_plan":
                  transformers' own base_model_tp_plan for the family, {} if none}
Dropout is 0 everywhere, so the train-mode export is deterministic.

And, for the refusals:
  mixtral_grouped_mm.pt2  Mixtral with its default experts implementation:
                          calls transformers::grouped_mm_fallback, a custom op
                          defined only in Python
  llama_static.pt2        Llama exported without dynamic_shapes (batch 2, 16 tokens)
"""
import argparse
import hashlib
import json
import os
import sys
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))

VOCAB = 256
SEQ_MAX = 64
BATCH_MAX = 64

# Every decoder family the issue names, plus the pre-2020 architectures.
# name -> (config class, model class, config overrides, kind)
DECODER = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=SEQ_MAX, use_cache=False, attention_dropout=0.0)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}, "tokens"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": True}, "tokens"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 8}, "tokens"),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}, "tokens"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 8}, "tokens"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 8}, "tokens"),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"head_dim": 8}, "tokens"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0, "resid_pdrop": 0.0, "embd_pdrop": 0.0},
             "tokens"),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {"pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 1},
              "tokens"),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {"hidden_dropout": 0.0, "eos_token_id": 1,
                                                         "bos_token_id": 1}, "tokens"),
    "falcon": ("FalconConfig", "FalconForCausalLM", {"hidden_dropout": 0.0, "eos_token_id": 1,
                                                     "bos_token_id": 1}, "tokens"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2,
                                                        "experts_implementation": "batched_mm",
                                                        "router_jitter_noise": 0.0}, "tokens"),
    # Variants a user exports as often: eager attention (explicit softmax and
    # masks instead of sdpa), and gradient checkpointing enabled (torch.export
    # traces through it: the program is the plain one).
    "llama_eager": ("LlamaConfig", "LlamaForCausalLM", {"attn_implementation": "eager"}, "tokens"),
    "llama_gc": ("LlamaConfig", "LlamaForCausalLM", {}, "tokens"),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(vocab_size=VOCAB, n_positions=SEQ_MAX, n_embd=32, n_layer=4,
                                                   n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                                   use_cache=False, bos_token_id=1, eos_token_id=1), "tokens"),
    "bert": ("BertConfig", "BertForMaskedLM", dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=4,
                                                   num_attention_heads=4, intermediate_size=64,
                                                   max_position_embeddings=SEQ_MAX, hidden_dropout_prob=0.0,
                                                   attention_probs_dropout_prob=0.0), "tokens"),
    "vit": ("ViTConfig", "ViTForImageClassification", dict(image_size=16, patch_size=4, num_channels=3,
                                                           hidden_size=32, num_hidden_layers=4,
                                                           num_attention_heads=4, intermediate_size=64, num_labels=5,
                                                           hidden_dropout_prob=0.0,
                                                           attention_probs_dropout_prob=0.0), "image"),
    "t5": ("T5Config", "T5ForConditionalGeneration", dict(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64,
                                                          num_layers=2, num_decoder_layers=2, num_heads=4,
                                                          dropout_rate=0.0, use_cache=False,
                                                          decoder_start_token_id=0, pad_token_id=0,
                                                          eos_token_id=1), "seq2seq"),
}
# The pre-2020 families keep their own config keys; the decoders share DECODER.
OWN_CONFIG = {"gpt2", "bert", "vit", "t5"}
GRADIENT_CHECKPOINTING = {"llama_gc"}


def build(name: str, seed: int = 0, overrides: dict = None):
    import transformers
    config_class, model_class, extra, kind = FAMILIES[name]
    kwargs = dict(extra) if name in OWN_CONFIG else dict(DECODER, **extra)
    kwargs.update(overrides or {})
    config = getattr(transformers, config_class)(**kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config)
    if name in GRADIENT_CHECKPOINTING:
        model.gradient_checkpointing_enable()
    model.train()  # dropout 0: train mode only keeps what training runs
    return model, kind


def example_inputs(kind: str):
    g = torch.Generator().manual_seed(1)
    if kind == "image":
        return (torch.randn(2, 3, 16, 16, generator=g),), {}
    x = torch.randint(0, VOCAB, (2, 16), generator=g)
    if kind == "seq2seq":
        return (x,), {"decoder_input_ids": torch.randint(0, VOCAB, (2, 12), generator=g)}
    return (x,), {}


def dynamic_shapes(kind: str):
    batch = torch.export.Dim("batch", min=1, max=BATCH_MAX)
    seq = torch.export.Dim("seq", min=2, max=SEQ_MAX)
    if kind == "image":
        return ({0: batch},)
    if kind == "seq2seq":
        target = torch.export.Dim("target", min=2, max=SEQ_MAX)
        return {"input_ids": {0: batch, 1: seq}, "decoder_input_ids": {0: batch, 1: target}}
    return ({0: batch, 1: seq},)


def blocks_of(model) -> list:
    """FQNs of the repeated blocks (children of every ModuleList), in order."""
    out = []
    for fqn, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList):
            out += [f"{fqn}.{i}" for i in range(len(module))]
    return out


def _replace(path: str, write) -> None:
    root, ext = os.path.splitext(path)
    tmp = root + ".tmp" + ext  # torch.export.save wants its file to end in .pt2
    write(tmp)
    os.replace(tmp, path)


def save_family(name: str, out: str) -> None:
    model, kind = build(name)
    args, kwargs = example_inputs(kind)
    ep = torch.export.export(model, args, kwargs=kwargs, dynamic_shapes=dynamic_shapes(kind))
    _replace(os.path.join(out, name + ".pt2"), lambda p: torch.export.save(ep, p))
    _replace(os.path.join(out, name + ".init.pt"),
             lambda p: torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, p))
    config_class, model_class, _, _ = FAMILIES[name]
    meta = {
        "family": name, "config_class": config_class, "model_class": model_class,
        "config": model.config.to_dict(), "kind": kind,
        "inputs": ["pixel_values"] if kind == "image" else
                  ["input_ids", "decoder_input_ids"] if kind == "seq2seq" else ["input_ids"],
        "vocab": VOCAB, "image": [3, 16, 16], "labels": 5, "blocks": blocks_of(model),
        "attn_implementation": model.config._attn_implementation,
        "gradient_checkpointing": name in GRADIENT_CHECKPOINTING,
        "tp_plan": dict(getattr(model.config, "base_model_tp_plan", None) or {}),
    }
    _replace(os.path.join(out, name + ".json"), lambda p: open(p, "w").write(json.dumps(meta, indent=1)))


def save_bad_files(out: str) -> None:
    model, _ = build("mixtral", overrides={"experts_implementation": "grouped_mm"})
    args, _ = example_inputs("tokens")
    ep = torch.export.export(model, args, dynamic_shapes=dynamic_shapes("tokens"))
    _replace(os.path.join(out, "mixtral_grouped_mm.pt2"), lambda p: torch.export.save(ep, p))
    model, _ = build("llama")
    ep = torch.export.export(model, args)
    _replace(os.path.join(out, "llama_static.pt2"), lambda p: torch.export.save(ep, p))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--families", nargs="*", default=list(FAMILIES), help="only these (default: all)")
    args = parser.parse_args()
    import transformers
    import transformers.modeling_outputs  # noqa: F401  (registers ModelOutput pytree nodes for torch.export)

    digest = hashlib.sha256()
    with open(os.path.abspath(__file__), "rb") as f:
        digest.update(f.read())
    digest.update(repr((args.families, torch.__version__, transformers.__version__)).encode())
    stamp = os.path.join(args.out, ".zoo-hash")
    key = digest.hexdigest()
    if os.path.exists(stamp) and open(stamp).read().strip() == key:
        return
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    for name in args.families:
        save_family(name, args.out)
    save_bad_files(args.out)
    with open(stamp + ".tmp", "w") as f:
        f.write(key + "\n")
    os.replace(stamp + ".tmp", stamp)


if __name__ == "__main__":
    sys.dont_write_bytecode = True
    main()
