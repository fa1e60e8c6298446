#!/usr/bin/python3
"""A trained, exported model loads in plain PyTorch.

Trains the zoo's gpt for a few steps on 2 local ranks, exports it, and checks
in Python that torch.jit.load reads it, the tied wte/lm_head names still
share one tensor, the weights are the checkpoint's (whose stage files
torch.load reads too), and forward runs.

Usage: test_export_in_python.py PIPEFORGE_BINARY ZOO_DIR
"""
import functools
import os
import subprocess
import sys
import tempfile

import torch


def main() -> None:
    binary, zoo = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory(prefix="pf-export-py-") as d:
        tokens = (torch.arange(4096) * 7 % 64).to(torch.int16).numpy().astype("<u2")
        tokens.tofile(os.path.join(d, "tokens.bin"))
        config = os.path.join(d, "train.yaml")
        with open(config, "w") as f:
            f.write(f"""model: {{path: {zoo}/gpt.pt, num_stages: 2, policy: parameters}}
pipeline: {{schedule: 1F1B, microbatches: 2}}
optimizer: {{name: adamw, lr: 1.0e-2}}
data: {{format: tokens, path: {d}/tokens.bin, block_size: 16}}
training: {{steps: 3, global_batch_size: 4}}
checkpoint: {{dir: {d}/ckpt}}
output: {{dir: {d}/out}}
""")
        subprocess.run([binary, "train", "--config", config, "--nproc", "2"], check=True, stdout=subprocess.DEVNULL)
        out = os.path.join(d, "trained.pt")
        subprocess.run([binary, "export", os.path.join(d, "ckpt"), "--model", f"{zoo}/gpt.pt", "--out", out],
                       check=True)

        trained = torch.jit.load(out)
        original = torch.jit.load(f"{zoo}/gpt.pt")
        assert trained.lm_head.weight.data_ptr() == trained.wte.weight.data_ptr(), "tied names no longer share"
        assert not torch.equal(trained.wte.weight, original.wte.weight), "the weights did not change"

        stage1 = torch.load(os.path.join(d, "ckpt", "step_00000003", "stage_1.pt"))
        assert stage1["step"] == 3
        for name, value in stage1["parameters"].items():
            # By attribute path: named_parameters() lists a shared tensor under one name only.
            assert torch.equal(functools.reduce(getattr, name.split("."), trained), value), name

        idx = torch.randint(0, 64, (2, 16))
        logits = trained(idx)
        assert logits.shape == (2, 16, 64), logits.shape
    print("exported model loads in torch.jit.load with its tied weights shared")


if __name__ == "__main__":
    main()
