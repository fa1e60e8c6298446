#!/usr/bin/env python3
"""Pretrained checkpoints in and out: a save_pretrained folder fills a meta-device export, trains, and comes back
as a folder from_pretrained loads (issue 41).

For each family (Llama; Qwen2, tied embeddings; Gemma, tied and scaled
embeddings; Mixtral with batched_mm experts; GPT-2, Conv1D and tied) built
from the configs of tests/models/generate_hf_zoo.py, and each checkpoint
dtype (float32, bfloat16):
  1. "pretrained": the transformers model under a fixed seed (cast to bf16 for
     the bf16 case), save_pretrained(max_shard_size="20KB"): sharded, with
     model.safetensors.index.json, tied lm_head.weight left out;
  2. pipeforge.export_on_meta of the same class: the float32 program with
     every parameter on the meta device, dynamic batch (1..64) and sequence
     (2..64), and its buffers file (rotary inv_freq, the tied-weight map);
  3. `pipeforge split meta.pt2 --weights PRETRAINED --weights meta.buffers.safetensors`
     into 2 stages: the stage files, chained as pipe.json says, equal the
     pretrained model in float32 (for bf16, the bf16 weights cast to float32:
     from_pretrained(..., dtype=torch.float32)), max |diff| <= 1e-5;
  4. `pipeforge train --nproc 2` with `model: {path: meta.pt2, weights:
     [PRETRAINED, BUFFERS]}`, 1F1B (and, for float32, ZBVZeroBubble with 2
     stages per rank), SGD with momentum, 3 steps: per-step losses and final
     weights equal eager training of from_pretrained(PRETRAINED,
     dtype=torch.float32) on the same rows (interop_common.batch_rows), cut
     into the same microbatches, rtol 1e-4, atol 1e-5;
  5. `pipeforge export RUN/ckpt --model meta.pt2 --format safetensors --like
     PRETRAINED --max-shard-size 20KB` (and `--dtype bfloat16` for the bf16
     case): a sharded folder with the --like folder's config.json (its dtype
     the one written: float32 without --dtype, even from a bf16 --like, so
     from_pretrained's dtype="auto" keeps the fine-tuned float32 weights),
     generation_config.json and tokenizer files, the same
     tensor names as the pretrained folder (tied duplicates dropped as
     save_pretrained drops them); AutoModelForCausalLM.from_pretrained of it
     reports no missing, unexpected or mismatched keys and its weights and
     logits equal the eager fine-tuned model's (bf16: against the eager model
     cast to bf16, rtol/atol 1e-2). The float32 export (no --dtype) is what
     step 4's final weights are read from.
Then the refusals, on the float32 Llama, each exit 1 with its message and no
--out folder written: a meta export split without --weights; a tensor missing
from the sources (the buffers file left out: rotary inv_freq; a pretrained
copy whose index lost a shard); a shape that does not fit; a tensor no
parameter takes (and that --accept-unused-weights then splits); --weights with
a TorchScript .pt.

Mixtral: transformers renames Mixtral's weights on load (per-expert
block_sparse_moe.experts.N.w1/w2/w3 -> mlp.experts.gate_up_proj/down_proj)
and save_pretrained writes the original names by default (scale-facts 1.5):
the split assembles the model's tensors from them (Note [Checkpoint renames]
in frontend/pt2_weights.cpp); the export writes the in-memory names, which
from_pretrained loads without missing keys.

A table family x dtype (chain diff, max loss diff, max final-weight diff,
from_pretrained diff, seconds) is printed.

Usage: test_pretrained_weights.py PIPEFORGE_BINARY [FAMILY ...]
"""
import json
import os
import shutil
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "interop"))
sys.path.insert(0, os.path.join(HERE, "..", "models"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "stage"))
import interop_common as common  # noqa: E402
from test_hf_stages_in_python import chain as chain_stages  # noqa: E402

FAMILIES = ["llama", "qwen2", "gemma", "mixtral", "gpt2"]
DTYPES = ["float32", "bfloat16"]
STEPS = 3
MICROBATCHES = 4
ROWS_PER_MB = 3
SEED = 7
INIT_SEED = 11
RTOL, ATOL = 1e-4, 1e-5
CHAIN_TOLERANCE = 1e-5
BF16_TOL = 1e-2
SEQ = 20
DATA_ROWS = 48
SHARD = "20KB"
SGD = "name: sgd, lr: 0.05, momentum: 0.9, weight_decay: 0.01"
# label -> (schedule, stages per rank); pipeline ranks 2, data parallel 1
LAYOUTS = {"1F1B": ("1F1B", 1), "ZBV": ("ZBVZeroBubble", 2)}
LAYOUTS_FOR = {"float32": ["1F1B", "ZBV"], "bfloat16": ["1F1B"]}
EXTRA_LOAD = {"mixtral": {"experts_implementation": "batched_mm"}}  # not saved in config.json


def make_config(zoo, name: str):
    import transformers
    config_class, model_class, extra, _ = zoo.FAMILIES[name]
    kwargs = dict(extra) if name in zoo.OWN_CONFIG else dict(zoo.DECODER, **extra)
    return getattr(transformers, config_class)(**kwargs), getattr(transformers, model_class)


def run(binary: str, *args: str, env: dict = None) -> subprocess.CompletedProcess:
    return subprocess.run([binary, *args], capture_output=True, text=True,
                          env=None if env is None else dict(os.environ, **env))


def split(binary: str, model: str, weights: list, spec: str, out: str, *extra: str) -> subprocess.CompletedProcess:
    args = ["split", model]
    for w in weights:
        args += ["--weights", w]
    return run(binary, *args, *extra, "--spec", spec, "--out", out)


def chain(torch, stage_dir: str, inputs: list) -> list:
    """The stage files run in pipe.json's order."""
    with open(os.path.join(stage_dir, "pipe.json")) as f:
        return chain_stages(stage_dir, json.load(f), inputs, torch)


def load(torch, name: str, folder: str, dtype=None, info: bool = False):
    import transformers
    kwargs = dict(EXTRA_LOAD.get(name, {}))
    if dtype is not None:
        kwargs["dtype"] = dtype
    return transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=info, **kwargs)


def checkpoint_names(folder: str) -> set:
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            return set(json.load(f)["weight_map"])
    from safetensors import safe_open
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        return set(f.keys())


def checkpoint_dtypes(folder: str) -> set:
    """The safetensors dtype names of every tensor in the folder's files."""
    import struct
    out = set()
    for n in os.listdir(folder):
        if n.endswith(".safetensors"):
            with open(os.path.join(folder, n), "rb") as f:
                size = struct.unpack("<Q", f.read(8))[0]
                header = json.loads(f.read(size))
            out |= {v["dtype"] for k, v in header.items() if k != "__metadata__"}
    return out


def make_data(torch, path: str) -> None:
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 256, (DATA_ROWS, SEQ + 1), generator=g)
    torch.save({"inputs": tokens[:, :-1].contiguous(), "targets": tokens[:, 1:].contiguous()}, path)


def train_eager(torch, model, data_path: str):
    """interop_common's batching: each microbatch's mean cross-entropy / microbatches, one SGD step."""
    import torch.nn.functional as F
    model.train()
    data = torch.load(data_path)
    inputs, targets = data["inputs"], data["targets"]
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=0.01, foreach=False)
    batch = ROWS_PER_MB * MICROBATCHES
    losses = []
    for step in range(STEPS):
        rows = torch.tensor(common.batch_rows(SEED, DATA_ROWS, step, batch))
        x, y = inputs.index_select(0, rows), targets.index_select(0, rows)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for mb in range(MICROBATCHES):
            part = slice(mb * ROWS_PER_MB, (mb + 1) * ROWS_PER_MB)
            out = model(input_ids=x[part]).logits
            loss = F.cross_entropy(out.reshape(-1, out.size(-1)), y[part].reshape(-1))
            (loss / MICROBATCHES).backward()
            total += loss.item() / MICROBATCHES
        opt.step()
        losses.append(total)
    return losses


def train_pipeforge(binary: str, run_dir: str, model_path: str, weights: list, data_path: str, layout: str) -> list:
    schedule, per_rank = LAYOUTS[layout]
    config = run_dir + ".yaml"
    with open(config, "w") as f:
        f.write(f"""model: {{path: {model_path}, weights: [{', '.join(weights)}], num_stages: {2 * per_rank}, policy: parameters}}
pipeline: {{schedule: {schedule}, microbatches: {MICROBATCHES}, stages_per_rank: {per_rank}}}
loss: cross_entropy
optimizer: {{{SGD}}}
lr_schedule: {{decay: constant, warmup_steps: 0}}
data: {{format: tensors, path: {data_path}, val_fraction: 0.0}}
training: {{steps: {STEPS}, global_batch_size: {ROWS_PER_MB * MICROBATCHES}, seed: {SEED}, eval_every: 0}}
checkpoint: {{dir: {run_dir}/ckpt}}
distributed: {{timeout_s: 60}}
output: {{dir: {run_dir}/out}}
""")
    common.run_pipeforge(binary, "train", "--config", config, "--nproc", "2", env={"OMP_NUM_THREADS": "1"})
    with open(os.path.join(run_dir, "out", "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return [r["loss"] for r in sorted((r for r in records if r["event"] == "train"), key=lambda r: r["step"])]


def export_folder(binary: str, run_dir: str, model_path: str, like: str, out: str, dtype: str = None) -> None:
    args = ["export", os.path.join(run_dir, "ckpt"), "--model", model_path, "--out", out, "--format", "safetensors",
            "--like", like, "--max-shard-size", SHARD]
    if dtype:
        args += ["--dtype", dtype]
    common.run_pipeforge(binary, *args)


def check_exported_folder(torch, name: str, folder: str, like: str, dtype: str, ref_model, ids) -> tuple:
    """from_pretrained(folder) against the eager fine-tuned model (in `dtype`). Returns (problems, weight diff,
    logits diff)."""
    problems = []
    if not os.path.exists(os.path.join(folder, "model.safetensors.index.json")):
        problems.append(f"{folder}: not sharded at --max-shard-size {SHARD} (no model.safetensors.index.json)")
    for n in ("config.json", "generation_config.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(like, n)) and not os.path.exists(os.path.join(folder, n)):
            problems.append(f"{n} of --like was not copied")
    with open(os.path.join(folder, "config.json")) as f:
        config_dtype = json.load(f).get("dtype")
    if config_dtype != dtype:
        problems.append(f"config.json says dtype {config_dtype!r}, the export wrote {dtype}")
    want_st = {"float32": "F32", "bfloat16": "BF16"}[dtype]
    if checkpoint_dtypes(folder) != {want_st}:
        problems.append(f"tensors are {sorted(checkpoint_dtypes(folder))}, not {want_st}")
    names, like_names = checkpoint_names(folder), checkpoint_names(like)
    if names != like_names:
        problems.append(f"names differ from --like's: only exported {sorted(names - like_names)[:5]}, "
                        f"only in --like {sorted(like_names - names)[:5]}")
    model, info = load(torch, name, folder, info=True)
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        if info[key]:
            problems.append(f"from_pretrained {key}: {sorted(info[key])[:5]}")
    if model.dtype != getattr(torch, dtype):
        problems.append(f"from_pretrained gave {model.dtype}, not {dtype}")
    rtol, atol = (RTOL, ATOL) if dtype == "float32" else (BF16_TOL, BF16_TOL)
    ref_state = {k: v.to(getattr(torch, dtype)) for k, v in ref_model.state_dict().items()}
    state = model.state_dict()
    weight_diff = 0.0
    if sorted(state) != sorted(ref_state):
        problems.append(f"state_dict names differ: {sorted(set(state) ^ set(ref_state))[:5]}")
    bad = []
    for k in sorted(set(state) & set(ref_state)):
        a, b = state[k], ref_state[k]
        diff = (a.double() - b.double()).abs().max().item()
        weight_diff = max(weight_diff, diff)
        if not torch.allclose(a.float(), b.float(), rtol=rtol, atol=atol):
            bad.append((diff, k))
    if bad:
        problems.append(f"from_pretrained: {len(bad)} tensors differ from the eager fine-tuned model's, e.g. "
                        f"{max(bad)[1]} by {max(bad)[0]:.3g}")
    # Logits in float32 of the weights as loaded, against the eager model's weights in `dtype`.
    ref = {k: v.float() for k, v in ref_state.items()}
    ref_copy = load(torch, name, like, dtype=torch.float32)
    ref_copy.load_state_dict(ref, strict=True)
    model = model.float().eval()
    ref_copy.eval()
    with torch.no_grad():
        got, want = model(input_ids=ids).logits, ref_copy(input_ids=ids).logits
    logits_diff = (got - want).abs().max().item()
    if not torch.allclose(got, want, rtol=rtol, atol=atol):
        problems.append(f"from_pretrained logits differ from the eager fine-tuned model's by {logits_diff:.3g}")
    return problems, weight_diff, logits_diff


def refusal(r: subprocess.CompletedProcess, out: str, label: str, fragments: list, any_of: list = None) -> list:
    text = r.stdout + r.stderr
    missing = [f for f in fragments if f not in text]
    if any_of and not any(f in text for f in any_of):
        missing.append(" or ".join(repr(f) for f in any_of))
    problems = []
    if r.returncode != 1 or missing:
        problems.append(f"refusal '{label}': exit {r.returncode}, missing {missing}:\n{text}")
    if os.path.exists(out):
        problems.append(f"refusal '{label}': {out} was written")
    if not problems:
        print(f"refused {label}: {text.strip().splitlines()[-1][:240]}")
    return problems


def check_refusals(torch, binary: str, d: str, spec: str, meta_pt2: str, buffers: str, pre_dir: str) -> list:
    from safetensors.torch import save_file
    problems = []
    out = os.path.join(d, "refused-stages")
    # A meta export without --weights.
    problems += refusal(split(binary, meta_pt2, [], spec, out), out, "meta export without --weights",
                        ["was exported on the meta device", "--weights SRC"])
    # The buffers file left out: rotary inv_freq has no value.
    problems += refusal(split(binary, meta_pt2, [pre_dir], spec, out), out, "no buffers file",
                        ["the model needs", "no value in --weights", "model.rotary_emb.inv_freq"])
    # A pretrained copy whose index lost its last shard (the file deleted too).
    cut = os.path.join(d, "pretrained-cut")
    shutil.copytree(pre_dir, cut)
    index_path = os.path.join(cut, "model.safetensors.index.json")
    with open(index_path) as f:
        index = json.load(f)
    last = sorted(set(index["weight_map"].values()))[-1]
    lost = sorted(k for k, v in index["weight_map"].items() if v == last)
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != last}
    with open(index_path, "w") as f:
        json.dump(index, f, indent=2)
    os.remove(os.path.join(cut, last))
    problems += refusal(split(binary, meta_pt2, [cut, buffers], spec, out), out, f"index without {last}",
                        ["the model needs", "no value in --weights", lost[0]])
    # A tensor of the wrong shape, in a source given first (the first source that has a name gives it).
    bad = os.path.join(d, "misfit.safetensors")
    save_file({"model.norm.weight": torch.ones(7)}, bad)
    problems += refusal(split(binary, meta_pt2, [bad, pre_dir, buffers], spec, out), out, "shape misfit",
                        ["is float32[", "model.norm.weight"], any_of=["do not fit the model", "does not fit the model"])
    # A tensor no parameter takes; then accepted with --accept-unused-weights.
    extra = os.path.join(d, "extra.safetensors")
    save_file({"extra.weight": torch.zeros(3, 2)}, extra)
    problems += refusal(split(binary, meta_pt2, [pre_dir, buffers, extra], spec, out), out, "unused tensor",
                        ["--accept-unused-weights", "extra.weight"])
    r = split(binary, meta_pt2, [pre_dir, buffers, extra], spec, out, "--accept-unused-weights")
    if r.returncode != 0 or not os.path.exists(os.path.join(out, "pipe.json")):
        problems.append(f"--accept-unused-weights: exit {r.returncode}:\n{r.stdout}{r.stderr}")
    else:
        print("split with --accept-unused-weights: ok")
        shutil.rmtree(out)
    # --weights with a TorchScript model.
    script = os.path.join(d, "linear.pt")
    torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))).save(script)
    problems += refusal(split(binary, script, [pre_dir], spec, out), out, "--weights with TorchScript",
                        ["--weights fills a torch.export program"])
    return problems


def worst(a, b):
    return b if a is None else max(a, b)


def run_family(torch, zoo, binary: str, d: str, name: str, data_path: str, spec: str, ids, table: list,
               refusals: bool) -> list:
    from pipeforge.meta_export import export_on_meta
    failures = []
    config, cls = make_config(zoo, name)
    fam = os.path.join(d, name)
    os.makedirs(fam)
    meta_pt2 = os.path.join(fam, "meta.pt2")
    start = time.time()
    batch = torch.export.Dim("batch", min=1, max=zoo.BATCH_MAX)
    seq = torch.export.Dim("seq", min=2, max=zoo.SEQ_MAX)
    example = zoo.example_inputs("tokens")[0]
    _, buffers = export_on_meta(lambda: cls(config).train(), example, dynamic_shapes=({0: batch, 1: seq},),
                                path=meta_pt2)
    print(f"{name:8s} export_on_meta {time.time() - start:4.1f} s", flush=True)
    for dtype in DTYPES:
        start = time.time()
        label = f"{name} {dtype}"
        here = os.path.join(fam, dtype)
        os.makedirs(here)
        pre_dir = os.path.join(here, "pretrained")
        torch.manual_seed(INIT_SEED)
        model = cls(config).train()
        if dtype == "bfloat16":
            model = model.to(torch.bfloat16)
        # Mixtral: save_pretrained writes the original per-expert layout by
        # default, which the split assembles (Note [Checkpoint renames]).
        model.save_pretrained(pre_dir, max_shard_size=SHARD)
        if name == "mixtral":
            with open(os.path.join(pre_dir, "model.safetensors.index.json")) as f:
                keys = json.load(f)["weight_map"]
            if not any(".block_sparse_moe.experts.0.w1.weight" in k for k in keys):
                failures.append(f"{label}: save_pretrained did not write Mixtral's original per-expert names")
        del model
        if not os.path.exists(os.path.join(pre_dir, "model.safetensors.index.json")):
            failures.append(f"{label}: save_pretrained at {SHARD} did not shard")
        # A tokenizer file for --like to copy.
        with open(os.path.join(pre_dir, "tokenizer_config.json"), "w") as f:
            json.dump({"model_max_length": zoo.SEQ_MAX}, f)

        reference = load(torch, name, pre_dir, dtype=torch.float32).train()
        initial = {k: v.detach().clone() for k, v in reference.state_dict().items()}
        # 3. split and chain.
        stages = os.path.join(here, "stages")
        r = split(binary, meta_pt2, [pre_dir, buffers], spec, stages)
        if r.returncode != 0:
            failures.append(f"{label}: split exited {r.returncode}:\n{r.stdout}{r.stderr}")
            table.append((name, dtype, None, None, None, None, time.time() - start))
            continue
        try:
            with torch.no_grad():
                got = chain(torch, stages, [ids])[0]
                want = reference(input_ids=ids).logits
            chain_diff = (got - want).abs().max().item() if got.shape == want.shape else float("inf")
            if not chain_diff <= CHAIN_TOLERANCE:
                failures.append(f"{label}: chained stages differ from the pretrained model by {chain_diff:.3g}")
        except Exception as e:  # noqa: BLE001  (a stage file torch cannot load or run: reported, the rest goes on)
            chain_diff = None
            failures.append(f"{label}: the stage files do not run in PyTorch: {type(e).__name__}: {e}")
        # 4. train, eagerly and with Pipeforge.
        ref_losses = train_eager(torch, reference, data_path)
        ref_state = {k: v.detach().clone() for k, v in reference.state_dict().items()}
        loss_diff = weight_diff = load_diff = None  # None: not measured (a step failed)
        for layout in LAYOUTS_FOR[dtype]:
            run_dir = os.path.join(here, layout)
            try:
                losses = train_pipeforge(binary, run_dir, meta_pt2, [pre_dir, buffers], data_path, layout)
                exported = os.path.join(run_dir, "exported")
                export_folder(binary, run_dir, meta_pt2, pre_dir, exported)
            except AssertionError as e:
                failures.append(f"{label} {layout}: {e}")
                continue
            trained = load(torch, name, exported, dtype=torch.float32)
            state = {k: v.detach().clone() for k, v in trained.state_dict().items()}
            problems, ld, wd = common.compare_training(torch, losses, ref_losses, state, ref_state, RTOL, ATOL,
                                                       initial)
            loss_diff, weight_diff = worst(loss_diff, ld), worst(weight_diff, wd)
            failures += [f"{label} {layout}: {p}" for p in problems]
            print(f"{label:17s} {layout:5s} max |loss diff| {ld:.2e}  max |weight diff| {wd:.2e}  "
                  f"{'ok' if not problems else 'MISMATCH'}", flush=True)
            # 5. the export loads with from_pretrained (float32; --dtype bfloat16 for the bf16 checkpoint).
            if layout == "1F1B":
                folders = [(exported, "float32")]
                if dtype == "bfloat16":
                    as_bf16 = os.path.join(run_dir, "exported-bf16")
                    try:
                        export_folder(binary, run_dir, meta_pt2, pre_dir, as_bf16, "bfloat16")
                        folders.append((as_bf16, "bfloat16"))
                    except AssertionError as e:
                        failures.append(f"{label} export --dtype bfloat16: {e}")
                for folder, as_dtype in folders:
                    problems, wd2, logits_diff = check_exported_folder(torch, name, folder, pre_dir, as_dtype,
                                                                       reference, ids)
                    load_diff = worst(load_diff, max(wd2, logits_diff))
                    failures += [f"{label} {layout} export {as_dtype}: {p}" for p in problems]
                    print(f"{label:17s} export {as_dtype:8s} from_pretrained: max |weight diff| {wd2:.2e}  "
                          f"max |logits diff| {logits_diff:.2e}  {'ok' if not problems else 'MISMATCH'}", flush=True)
        seconds = time.time() - start
        table.append((name, dtype, chain_diff, loss_diff, weight_diff, load_diff, seconds))
        print(f"{label:17s} done in {seconds:5.1f} s", flush=True)
        if refusals and dtype == "float32":
            failures += check_refusals(torch, binary, here, spec, meta_pt2, buffers, pre_dir)
    return failures


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__.strip().splitlines()[-1])
    binary = sys.argv[1]
    only = sys.argv[2:]
    try:
        import torch
        import safetensors.torch  # noqa: F401
        import transformers
        import transformers.modeling_outputs  # noqa: F401  (torch.export.load of a ModelOutput program)
    except ImportError as e:
        common.skip(f"{sys.executable} cannot import torch, safetensors and transformers: {e}")
    if not hasattr(torch, "export"):
        common.skip(f"torch {torch.__version__} has no torch.export")
    import warnings
    import generate_hf_zoo as zoo
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)
    families = [f for f in FAMILIES if not only or f in only]
    unknown = set(only) - set(FAMILIES)
    if unknown:
        raise SystemExit(f"no such family: {sorted(unknown)} (have {FAMILIES})")
    failures, table = [], []
    begin = time.time()
    with common.temp_dir("pf-pretrained-") as d:
        data_path = os.path.join(d, "data.pt")
        make_data(torch, data_path)
        spec = os.path.join(d, "spec.yaml")
        with open(spec, "w") as f:
            f.write("num_stages: 2\npolicy: parameters\n")
        ids = torch.randint(0, zoo.VOCAB, (3, 11), generator=torch.Generator().manual_seed(5))
        for name in families:
            failures += run_family(torch, zoo, binary, d, name, data_path, spec, ids, table,
                                   refusals=name == "llama")
    print(f"\nfamily   dtype     chain |diff|  max|loss diff| max|weight diff| from_pretrained  seconds")
    fmt = lambda v: f"{v:.2e}" if v is not None else "   -    "  # noqa: E731
    for name, dtype, chain_diff, loss_diff, weight_diff, load_diff, seconds in table:
        print(f"{name:8s} {dtype:9s} {fmt(chain_diff):>12s} {fmt(loss_diff):>14s} {fmt(weight_diff):>16s} "
              f"{fmt(load_diff):>15s} {seconds:8.1f}")
    print(f"total {time.time() - begin:.1f} s")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print(f"{len(families)} families: pretrained weights split, train and export back as from_pretrained loads "
          f"(chain <= {CHAIN_TOLERANCE}, training rtol {RTOL} atol {ATOL})")


if __name__ == "__main__":
    main()
