#!/usr/bin/python3
"""Which torch.save files `data.format: tensors` reads, with Python's own torch.save.

Reads: torch.save({"inputs": x, "targets": y}) in the default zip format,
several tensors as a tuple; a scripted module with attributes inputs/targets.
Refused with a message that says how to save instead: a legacy pickle
(_use_new_zipfile_serialization=False) and lists inside the dict.

Usage: test_tensor_data_from_python.py PIPEFORGE_BINARY ZOO_DIR
"""
import os
import subprocess
import sys
import tempfile
from typing import List

import torch


class Holder(torch.nn.Module):
    inputs: List[torch.Tensor]
    targets: torch.Tensor

    def __init__(self, inputs: List[torch.Tensor], targets: torch.Tensor) -> None:
        super().__init__()
        self.inputs = inputs
        self.targets = targets

    def forward(self) -> int:
        return len(self.inputs)


def train(binary: str, zoo: str, d: str, data: str, model_keys: str = "", loss: str = "mse"):
    config = os.path.join(d, "train.yaml")
    with open(config, "w") as f:
        f.write(f"""model: {{path: {zoo}/mlp.pt, num_stages: 2, policy: parameters{model_keys}}}
pipeline: {{schedule: GPipe, microbatches: 2}}
loss: {loss}
optimizer: {{name: sgd, lr: 0.05}}
data: {{format: tensors, path: {data}}}
training: {{steps: 2, global_batch_size: 8}}
output: {{dir: {d}/out}}
""")
    return subprocess.run([binary, "train", "--config", config, "--nproc", "2"], capture_output=True, text=True)


def main() -> None:
    binary, zoo = sys.argv[1], sys.argv[2]
    x, y = torch.randn(64, 8), torch.randn(64, 4)
    with tempfile.TemporaryDirectory(prefix="pf-tensor-data-") as d:
        readable = {
            "zip dict": lambda p: torch.save({"inputs": x, "targets": y}, p),
            "zip dict of tuples": lambda p: torch.save({"inputs": (x,), "targets": (y,)}, p),
            "scripted holder": lambda p: torch.jit.script(Holder([x], y)).save(p),
        }
        for name, save in readable.items():
            path = os.path.join(d, name.replace(" ", "_") + ".pt")
            save(path)
            r = train(binary, zoo, d, path)
            assert r.returncode == 0, f"{name}: {r.stdout}{r.stderr}"
            print(f"reads {name}")
        refused = {
            "legacy pickle": (lambda p: torch.save({"inputs": x, "targets": y}, p,
                                                   _use_new_zipfile_serialization=False), "not a zip archive"),
        }
        # LibTorch 1.13's C++ unpickler cannot read lists inside a dict, and we say
        # so; 2.x reads them (the torch here is the LibTorch the binary links).
        lists = ("lists in the dict", lambda p: torch.save({"inputs": [x], "targets": [y]}, p))
        if tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 0):
            path = os.path.join(d, "lists_in_the_dict.pt")
            lists[1](path)
            r = train(binary, zoo, d, path)
            assert r.returncode == 0 and "64 rows" in r.stdout, f"{lists[0]}: {r.stdout}{r.stderr}"
            print(f"reads {lists[0]}")
        else:
            refused[lists[0]] = (lists[1], "use tuples")
        for name, (save, message) in refused.items():
            path = os.path.join(d, name.replace(" ", "_") + ".pt")
            save(path)
            r = train(binary, zoo, d, path)
            assert r.returncode == 1 and message in r.stderr, f"{name}: {r.stdout}{r.stderr}"
            assert "torch.save({'inputs'" in r.stderr, r.stderr
            print(f"refuses {name}: {message}")

        # Issue 24.3: float64 data for a float32 model. With example_inputs the
        # split records the dtype and the launcher refuses the data before any
        # rank starts; without, the stage forward fails on rank 0, which is
        # reported as the user's input (exit 1) and as the rank that failed.
        path = os.path.join(d, "float64.pt")
        torch.save({"inputs": x.double(), "targets": y}, path)
        r = train(binary, zoo, d, path, ", example_inputs: [{shape: [4, 8], dtype: float32}]")
        text = r.stdout + r.stderr
        assert r.returncode == 1, f"float64 with example_inputs: exit {r.returncode}:\n{text}"
        assert f"data: inputs[0] ({path}) is float64; the model's input 'x' takes float32" in r.stderr, text
        assert "rank 0" not in text, text
        print(f"refuses float64 data before launch: {r.stderr.strip().splitlines()[0][:150]}")
        r = train(binary, zoo, d, path)
        text = r.stdout + r.stderr
        assert r.returncode == 1, f"float64 without example_inputs: exit {r.returncode} (1: user input):\n{text}"
        assert "rank 0 failed first" in text, text
        assert "stage 0 forward of microbatch 0 failed" in text, text
        print("float64 data found in stage 0's forward: exit 1, rank 0 named as the one that failed")

        # Issue 24.10: cross_entropy with float targets of the logits' shape is
        # refused by their dtype, not reported as a shape mismatch.
        path = os.path.join(d, "float_targets.pt")
        torch.save({"inputs": x, "targets": y}, path)
        r = train(binary, zoo, d, path, loss="cross_entropy")
        text = r.stdout + r.stderr
        assert r.returncode == 1, f"float targets for cross_entropy: exit {r.returncode}:\n{text}"
        assert "cross-entropy: target 0 is float32 (shape [4,4]); cross_entropy takes integer class indices" in text, \
            text
        print("refuses float targets for cross_entropy by their dtype")


if __name__ == "__main__":
    main()
