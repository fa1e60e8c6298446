"""Stages split from a torch.export `.pt2` are `.pt2` files that PyTorch loads
back (torch.export.load(path).module()), hold their parameters and buffers
under the original FQNs, and, chained as pipe.json says, reproduce
torch.export.load("model.pt2").module()(*inputs).

Run by ctest: PYTHON test_pt2_stages_in_python.py PIPEFORGE_BINARY PT2_ZOO_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import warnings

import torch

warnings.filterwarnings("ignore", category=DeprecationWarning)  # torch.jit.load of the .ref.pt holders

# Only the ORIGINAL markers model needs the marker ops; stage files never do.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import pipeforge  # noqa: E402,F401  (registers pipeforge::pipe_split)
import torch.distributed.pipelining  # noqa: E402,F401  (registers pippy::_pipe_split)

PIPEFORGE = sys.argv[1] if len(sys.argv) > 1 else "pipeforge"
ZOO = sys.argv[2] if len(sys.argv) > 2 else "build/zoo_pt2"
TOLERANCE = 1e-6

# (model, spec, expected number of stages); specs cut at depth >= 2, and policies.
CASES = [
    ("gpt", "split_points:\n  blocks.0.mlp: BEGINNING\n  blocks.1.attn.proj: END\n", 3),
    ("gpt", "num_stages: 4\npolicy: parameters\n", 4),
    ("gpt_dynamic", "split_points:\n  blocks.0.attn: END\n  blocks.1: BEGINNING\n", 3),
    ("multi_io", "split_points:\n  mid: BEGINNING\n  deep: BEGINNING\n  head: BEGINNING\n", 4),
    ("markers", None, 4),
    ("markers", "split_points:\n  pair.first: END\n", 5),
    ("resnet_eval", "split_points:\n  layer1.1.conv2: BEGINNING\n  layer2: BEGINNING\n", 3),
    ("resnet_eval", "num_stages: 4\npolicy: uniform\n", 4),
    ("regions", "split_points:\n  main: BEGINNING\n  out: BEGINNING\n", 3),
]


def chain(stage_dir, manifest, inputs):
    outputs = []
    for stage in manifest["stages"]:
        module = torch.export.load(os.path.join(stage_dir, stage["file"])).module()
        args = [inputs[s["index"]] if s["from"] == "input" else outputs[s["stage"]][s["index"]] for s in stage["inputs"]]
        result = module(*args)
        assert isinstance(result, tuple), "stage forward must return a tuple"
        assert len(result) == stage["num_outputs"], (len(result), stage["num_outputs"])
        outputs.append(result)
    return [inputs[o["index"]] if o["from"] == "input" else outputs[o["stage"]][o["index"]] for o in manifest["outputs"]]


def max_diff(got, want):
    if not isinstance(want, (tuple, list)):
        want = (want,)
    assert len(got) == len(want), (len(got), len(want))
    return max((g - w).abs().max().item() for g, w in zip(got, want))


class Pt2StagesLoadInPython(unittest.TestCase):
    def split(self, tmp, model_name, spec):
        out = os.path.join(tmp, "stages")
        cmd = [PIPEFORGE, "split", os.path.join(ZOO, model_name + ".pt2"), "--out", out]
        if spec:
            spec_path = os.path.join(tmp, "spec.yaml")
            with open(spec_path, "w") as f:
                f.write(spec)
            cmd += ["--spec", spec_path]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(out, "pipe.json")) as f:
            return out, json.load(f)

    def test_chained_stages_equal_the_exported_model(self):
        for model_name, spec, num_stages in CASES:
            with self.subTest(model=model_name, spec=spec):
                tmp = tempfile.mkdtemp(prefix="pf-pt2-py-")
                try:
                    out, manifest = self.split(tmp, model_name, spec)
                    self.assertEqual(manifest["stage_format"], "pt2")
                    self.assertEqual(manifest["num_stages"], num_stages)
                    original = torch.export.load(os.path.join(ZOO, model_name + ".pt2")).module()
                    inputs = list(torch.jit.load(os.path.join(ZOO, model_name + ".ref.pt")).inputs)
                    with torch.no_grad():
                        want = original(*inputs)
                        got = chain(out, manifest, inputs)
                    self.assertLessEqual(max_diff(got, want), TOLERANCE)

                    # Every stage holds its state under the original names, with equal values.
                    state = original.state_dict()
                    for stage in manifest["stages"]:
                        self.assertTrue(stage["file"].endswith(".pt2"), stage["file"])
                        module = torch.export.load(os.path.join(out, stage["file"])).module()
                        held = module.state_dict()
                        self.assertEqual(set(held), set(stage["parameters"]) | set(stage["buffers"]))
                        for name, tensor in held.items():
                            self.assertIn(name, state)
                            self.assertTrue(torch.equal(tensor, state[name]), name)

                    if model_name.startswith("gpt"):
                        # Tied wte / lm_head: each end holds it under its own name.
                        self.assertIn("wte.weight", manifest["stages"][0]["parameters"])
                        self.assertIn("lm_head.weight", manifest["stages"][-1]["parameters"])
                        self.assertIn(["lm_head.weight", "wte.weight"], [sorted(g) for g in manifest["tied"]])
                    if model_name == "gpt_dynamic":
                        # Dynamic batch: the stages take another batch size too.
                        for batch in (2, 5):
                            idx = torch.randint(0, 64, (batch, inputs[0].shape[1]), generator=torch.Generator().manual_seed(batch))
                            with torch.no_grad():
                                self.assertLessEqual(max_diff(chain(out, manifest, [idx]), original(idx)), TOLERANCE)
                    if model_name == "multi_io":
                        # `skip` skips a stage: it goes from stage 0 straight to stage 2.
                        sources = [(s["from"], s.get("stage")) for s in manifest["stages"][2]["inputs"]]
                        self.assertIn(("stage", 0), sources)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)

    def test_stage_archives_have_the_layout_torch_export_save_writes(self):
        tmp = tempfile.mkdtemp(prefix="pf-pt2-py-")
        try:
            out, manifest = self.split(tmp, "gpt", "split_points:\n  blocks.1: BEGINNING\n")
            import zipfile
            for stage in manifest["stages"]:
                path = os.path.join(out, stage["file"])
                root = os.path.splitext(stage["file"])[0]
                with zipfile.ZipFile(path) as z:
                    names = set(z.namelist())
                    for entry in ("archive_format", "archive_version", ".data/version", "byteorder",
                                  "models/model.json", "data/weights/model_weights_config.json",
                                  "data/constants/model_constants_config.json"):
                        self.assertIn(root + "/" + entry, names)
                    self.assertEqual(z.read(root + "/archive_format"), b"pt2")
                    config = json.loads(z.read(root + "/data/weights/model_weights_config.json"))["config"]
                    self.assertEqual(set(config), set(stage["parameters"]) | set(stage["buffers"]))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
