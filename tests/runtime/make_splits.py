#!/usr/bin/python3
"""Writes split directories (stage_<i>.pt + pipe.json) for zoo models, by hand.

For splits the real splitter cannot make: it cuts at submodule calls, and
multi_io has six submodules, but four ranks with two stages each need eight
stages. Each model is written as a list of *atoms* (one line of its forward,
with the submodules it calls), and a split into S stages groups the atoms into
S contiguous runs (multi_io's eight atoms include two without parameters). Every stage module keeps its submodules under
their original FQNs, takes its inputs in pipe.json order and returns a tuple.

A value produced by stage j and read by stage k > j + 1 (multi_io's `s`) gets
its source set to stage j directly, as the real splitter does; model outputs
may come from any stage.

Run with Debian's /usr/bin/python3:
  make_splits.py --zoo-src tests/models/generate_zoo.py --zoo-dir BUILD/zoo \
                 --out DIR --model gpt --stages 4
"""
import argparse
import importlib.util
import itertools
import json
import linecache
import os
import sys
from typing import Dict, List, Tuple

import torch
import torch.nn as nn


class Atom:
    def __init__(self, code: str, uses: List[str], defines: List[str], modules: List[str]) -> None:
        self.code = code          # one Python statement, submodules as M["fqn"]
        self.uses = uses          # values it reads
        self.defines = defines    # values it writes (SSA: each name defined once)
        self.modules = modules    # FQNs of the submodules it calls


def atoms_for(name: str, gpt_layers: int) -> Tuple[List[str], List[Atom], List[str]]:
    """(model inputs, atoms, model outputs) of a zoo model."""
    if name == "mlp":
        atoms = [Atom("h0 = F.relu(M['inp'](x))", ["x"], ["h0"], ["inp"])]
        for k in range(6):
            atoms.append(Atom(f"h{k + 1} = h{k} + F.relu(M['blocks.{k}'](h{k}))", [f"h{k}"], [f"h{k + 1}"], [f"blocks.{k}"]))
        atoms.append(Atom("y = M['out'](h6)", ["h6"], ["y"], ["out"]))
        return ["x"], atoms, ["y"]
    if name == "gpt":
        atoms = [
            Atom("tok = M['wte'](idx)", ["idx"], ["tok"], ["wte"]),
            # reads the root input `idx` again: fed straight from the batch
            Atom("x0 = tok + M['wpe'](torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device))",
                 ["tok", "idx"], ["x0"], ["wpe"]),
        ]
        v = 0
        for k in range(gpt_layers):
            atoms.append(Atom(f"x{v + 1} = x{v} + M['blocks.{k}.attn'](M['blocks.{k}.ln_1'](x{v}))",
                              [f"x{v}"], [f"x{v + 1}"], [f"blocks.{k}.ln_1", f"blocks.{k}.attn"]))
            atoms.append(Atom(f"x{v + 2} = x{v + 1} + M['blocks.{k}.mlp'](M['blocks.{k}.ln_2'](x{v + 1}))",
                              [f"x{v + 1}"], [f"x{v + 2}"], [f"blocks.{k}.ln_2", f"blocks.{k}.mlp"]))
            v += 2
        atoms.append(Atom(f"xf = M['ln_f'](x{v})", [f"x{v}"], ["xf"], ["ln_f"]))
        atoms.append(Atom("logits = M['lm_head'](xf)", ["xf"], ["logits"], ["lm_head"]))
        return ["idx"], atoms, ["logits"]
    if name == "multi_io":
        atoms = [
            Atom("s = torch.relu(M['enc_x'](x))", ["x"], ["s"], ["enc_x"]),
            Atom("e = M['enc_y'](y)", ["y"], ["e"], ["enc_y"]),
            Atom("h0 = s * mask.to(s.dtype) + e", ["s", "mask", "e"], ["h0"], []),
            Atom("h1 = torch.tanh(M['mid'](h0))", ["h0"], ["h1"], ["mid"]),
            Atom("h2 = torch.relu(M['deep'](h1))", ["h1"], ["h2"], ["deep"]),
            Atom("hs = h2 + s", ["h2", "s"], ["hs"], []),
            Atom("aux = M['aux'](h2).squeeze(-1)", ["h2"], ["aux"], ["aux"]),
            Atom("out = M['head'](hs)", ["hs"], ["out"], ["head"]),
        ]
        return ["x", "y", "mask"], atoms, ["out", "aux"]
    raise SystemExit(f"make_splits.py: no atoms for model '{name}'")


def module_expr(fqn: str) -> str:
    """`blocks.0.attn` -> `self.blocks["0"].attn` (ModuleDict for numeric parts)."""
    expr = "self"
    for part in fqn.split("."):
        expr += f'["{part}"]' if part.isdigit() else f".{part}"
    return expr


def attach(root: nn.Module, fqn: str, module: nn.Module) -> None:
    parts = fqn.split(".")
    parent = root
    for i, part in enumerate(parts[:-1]):
        nxt = parts[i + 1]
        if not hasattr(parent, part) or getattr(parent, part) is None:
            # ModuleDict where the child names are numbers (blocks.3), plain Module otherwise.
            container = nn.ModuleDict() if nxt.isdigit() else nn.Module()
            if isinstance(parent, nn.ModuleDict):
                parent[part] = container
            else:
                setattr(parent, part, container)
        parent = parent[part] if isinstance(parent, nn.ModuleDict) else getattr(parent, part)
    if isinstance(parent, nn.ModuleDict):
        parent[parts[-1]] = module
    else:
        setattr(parent, parts[-1], module)


_stage_ids = itertools.count()


def build_stage(model: nn.Module, atoms: List[Atom], inputs: List[str], outputs: List[str],
                dtypes: Dict[str, str]) -> nn.Module:
    stage = nn.Module()
    for atom in atoms:
        for fqn in atom.modules:
            attach(stage, fqn, model.get_submodule(fqn))
    args = ", ".join(f"{n}: torch.Tensor" for n in inputs)
    ret = ", ".join(["torch.Tensor"] * len(outputs))
    body = []
    for atom in atoms:
        line = atom.code
        for fqn in atom.modules:
            line = line.replace(f"M['{fqn}']", module_expr(fqn))
        body.append("        " + line)
    tail = ", ".join(outputs) + ("," if len(outputs) == 1 else "")
    src = (f"class Stage(nn.Module):\n"
           f"    def forward(self, {args}) -> Tuple[{ret}]:\n" + "\n".join(body) +
           f"\n        return ({tail})\n")
    # TorchScript reads a method's source through linecache: register it there.
    filename = f"<pipeforge-stage-{next(_stage_ids)}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    scope = {"nn": nn, "torch": torch, "F": torch.nn.functional, "Tuple": Tuple}
    exec(compile(src, filename, "exec"), scope)
    cls = scope["Stage"]
    stage.__class__ = type("Stage", (cls,), {})
    return torch.jit.script(stage)


def load_zoo_source(path: str):
    spec = importlib.util.spec_from_file_location("generate_zoo", path)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(path)), "..", "..", "python"))
    spec.loader.exec_module(mod)
    return mod


def write_split(zoo, zoo_dir: str, name: str, num_stages: int, out: str, gpt_layers: int) -> None:
    torch.manual_seed(0)  # as generate_zoo.save_model: the same weights as <zoo>/NAME.pt
    model, _, _ = zoo.build(name, gpt_layers)
    model.eval()
    if zoo_dir:
        saved = torch.jit.load(os.path.join(zoo_dir, name + ".pt"))
        ours = model.state_dict()
        for fqn, p in saved.named_parameters():
            if not torch.equal(p, ours[fqn]):
                raise SystemExit(f"make_splits.py: {name} parameter {fqn} differs from {zoo_dir}/{name}.pt")

    model_inputs, atoms, model_outputs = atoms_for(name, gpt_layers)
    if not 1 <= num_stages <= len(atoms):
        raise SystemExit(f"make_splits.py: {name} splits into 1..{len(atoms)} stages, not {num_stages}")
    bounds = [round(k * len(atoms) / num_stages) for k in range(num_stages + 1)]
    groups = [atoms[bounds[k]:bounds[k + 1]] for k in range(num_stages)]

    producer: Dict[str, int] = {}  # value -> stage that defines it
    for k, group in enumerate(groups):
        for atom in group:
            for v in atom.defines:
                producer[v] = k
    stage_inputs: List[List[str]] = []
    for k, group in enumerate(groups):
        defined, ins = set(), []
        for atom in group:
            for v in atom.uses:
                if v not in defined and v not in ins:
                    ins.append(v)
            defined.update(atom.defines)
        stage_inputs.append(ins)
    stage_outputs: List[List[str]] = []
    for k, group in enumerate(groups):
        outs = []
        for atom in group:
            for v in atom.defines:
                later = any(v in stage_inputs[j] for j in range(k + 1, num_stages))
                if later or v in model_outputs:
                    outs.append(v)
        stage_outputs.append(outs)

    def source(v: str):
        if v in model_inputs:
            return {"from": "input", "index": model_inputs.index(v)}
        k = producer[v]
        return {"from": "stage", "stage": k, "index": stage_outputs[k].index(v)}

    os.makedirs(out, exist_ok=True)
    stages = []
    for k, group in enumerate(groups):
        module = build_stage(model, group, stage_inputs[k], stage_outputs[k], {})
        file = f"stage_{k}.pt"
        module.save(os.path.join(out, file))
        stages.append({
            "index": k, "file": file,
            "inputs": [source(v) for v in stage_inputs[k]],
            "num_outputs": len(stage_outputs[k]),
            "parameters": [n for n, _ in module.named_parameters()],
            "buffers": [n for n, _ in module.named_buffers()],
        })
    tied = [["wte.weight", "lm_head.weight"]] if name == "gpt" else []
    manifest = {
        "format": "pipeforge.pipe/1", "num_stages": num_stages, "source": f"{name}.pt",
        "inputs": model_inputs, "outputs": [source(v) for v in model_outputs],
        "stages": stages, "tied": tied,
    }
    with open(os.path.join(out, "pipe.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo-src", required=True, help="tests/models/generate_zoo.py")
    parser.add_argument("--zoo-dir", default="", help="built zoo folder, to check the weights match")
    parser.add_argument("--out", required=True, help="output root: writes OUT/<model>_<stages>")
    parser.add_argument("--model", action="append", required=True)
    parser.add_argument("--stages", type=int, action="append", required=True)
    parser.add_argument("--gpt-layers", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    zoo = load_zoo_source(args.zoo_src)
    for name in args.model:
        for s in args.stages:
            write_split(zoo, args.zoo_dir, name, s, os.path.join(args.out, f"{name}_{s}"), args.gpt_layers)


if __name__ == "__main__":
    main()
