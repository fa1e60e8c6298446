"""Stage files load in plain PyTorch (torch.jit.load) and, chained as pipe.json
says, reproduce the original model's outputs.

Run by ctest: /usr/bin/python3 test_split_in_python.py PIPEFORGE_BINARY ZOO_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch

# Only the ORIGINAL markers model needs the pipe_split op; stage files never do.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import pipeforge  # noqa: E402,F401  (registers pipeforge::pipe_split)

PIPEFORGE = sys.argv[1] if len(sys.argv) > 1 else "pipeforge"
ZOO = sys.argv[2] if len(sys.argv) > 2 else "build/zoo"

CASES = [
    ("seed_example", "split_points:\n  layers.1: BEGINNING\n"),
    ("mlp", "split_points:\n  blocks.2: END\n  blocks.4.fc2: BEGINNING\n"),
    ("gpt", "split_points:\n  blocks.0.mlp: BEGINNING\n  blocks.1.attn.proj: END\n"),
    ("gpt", "num_stages: 4\npolicy: parameters\n"),
    ("markers", None),
    ("markers", "split_points:\n  pair.first: END\n"),
    ("multi_io", "split_points:\n  mid: BEGINNING\n  deep: BEGINNING\n  head: BEGINNING\n"),
    ("mlp_traced", "num_stages: 3\npolicy: uniform\n"),
]


def chain(stage_dir, manifest, inputs):
    outputs = []
    for stage in manifest["stages"]:
        module = torch.jit.load(os.path.join(stage_dir, stage["file"]))
        module.eval()
        args = [inputs[s["index"]] if s["from"] == "input" else outputs[s["stage"]][s["index"]] for s in stage["inputs"]]
        result = module(*args)
        assert isinstance(result, tuple), "stage forward must return a tuple"
        assert len(result) == stage["num_outputs"]
        outputs.append(result)
    return [inputs[o["index"]] if o["from"] == "input" else outputs[o["stage"]][o["index"]] for o in manifest["outputs"]]


class SplitLoadsInPython(unittest.TestCase):
    def test_chained_stage_files_match_the_model(self):
        for model_name, spec in CASES:
            with self.subTest(model=model_name, spec=spec):
                tmp = tempfile.mkdtemp(prefix="pf-py-")
                try:
                    out = os.path.join(tmp, "stages")
                    cmd = [PIPEFORGE, "split", os.path.join(ZOO, model_name + ".pt"), "--out", out]
                    if spec:
                        spec_path = os.path.join(tmp, "spec.yaml")
                        with open(spec_path, "w") as f:
                            f.write(spec)
                        cmd += ["--spec", spec_path]
                    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                    with open(os.path.join(out, "pipe.json")) as f:
                        manifest = json.load(f)
                    ref = torch.jit.load(os.path.join(ZOO, model_name + ".ref.pt"))
                    model = torch.jit.load(os.path.join(ZOO, model_name + ".pt"))
                    with torch.no_grad():
                        got = chain(out, manifest, list(ref.inputs))
                    self.assertEqual(len(got), len(ref.outputs))
                    for g, r in zip(got, ref.outputs):
                        self.assertLessEqual((g - r).abs().max().item(), 1e-6)
                    # Every stage parameter is an original state_dict key with an equal value.
                    original = model.state_dict()
                    for stage in manifest["stages"]:
                        module = torch.jit.load(os.path.join(out, stage["file"]))
                        for name, tensor in module.state_dict().items():
                            self.assertIn(name, original)
                            self.assertTrue(torch.equal(tensor, original[name]), name)
                    # Backward runs through every stage.
                    got = chain(out, manifest, list(ref.inputs))
                    sum(o.float().sum() for o in got).backward()
                finally:
                    shutil.rmtree(tmp)

    def test_stages_keep_the_models_argument_names_and_defaults(self):
        """Note [Stage signatures]: stage 0 reads `forward(self, x, mask=None)` as the model; the non-tensor
        `scale: float = 2.0` is baked in at its default (Note [Constant inputs]) and pipe.json says so."""
        from typing import Optional

        class Defaults(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.a = torch.nn.Linear(4, 4)
                self.b = torch.nn.Linear(4, 4)

            def forward(self, x, scale: float = 2.0, mask: Optional[torch.Tensor] = None):
                h = self.a(x) * scale
                if mask is not None:
                    h = h * mask
                return self.b(h)

        tmp = tempfile.mkdtemp(prefix="pf-py-")
        try:
            torch.manual_seed(0)
            model = torch.jit.script(Defaults())
            path = os.path.join(tmp, "defaults.pt")
            model.save(path)
            spec = os.path.join(tmp, "spec.yaml")
            with open(spec, "w") as f:
                f.write("split_points:\n  b: BEGINNING\n")
            out = os.path.join(tmp, "stages")
            subprocess.run([PIPEFORGE, "split", path, "--spec", spec, "--out", out], check=True,
                           stdout=subprocess.DEVNULL)
            stage0 = torch.jit.load(os.path.join(out, "stage_0.pt"))
            stage1 = torch.jit.load(os.path.join(out, "stage_1.pt"))
            want = [(a.name, a.default_value) for a in model.forward.schema.arguments[1:] if a.name != "scale"]
            got = [(a.name, a.default_value) for a in stage0.forward.schema.arguments[1:]]
            self.assertEqual(got, want)
            with open(os.path.join(out, "pipe.json")) as f:
                manifest = json.load(f)
            self.assertEqual(manifest["inputs"], ["x", "mask"])
            self.assertEqual(manifest["constant_inputs"], {"scale": 2.0})
            x, mask = torch.randn(3, 4), torch.rand(4)
            with torch.no_grad():
                for args, kwargs in [((x,), {}), ((x,), {"mask": mask}), ((x, mask), {})]:
                    expected = model(x, 2.0, *args[1:], **kwargs)
                    self.assertTrue(torch.equal(stage1(*stage0(*args, **kwargs))[0], expected), (args, kwargs))
        finally:
            shutil.rmtree(tmp)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]])
