#!/usr/bin/env python3
"""Makes the seeds of the `safetensors` fuzz target (fuzz/README.md).

Run with the venv's python (torch 2.13, safetensors 0.8), from the repository root:

    .venv/bin/python fuzz/make_safetensors_seeds.py

Writes small files as safetensors itself writes them into fuzz/corpus/safetensors/:
  basic.safetensors       fp32, bf16 and int64 tensors with {"format": "pt"} metadata
  scalar_empty.safetensors  a scalar (shape []) and empty tensors (shape [0], [3, 0])
  all_dtypes.safetensors  one tensor of every dtype torch can save (19 of the 22)
  f4.safetensors          packed F4 (two values a byte) beside BOOL and U8
Each is checked to load back with safetensors before it is kept.
"""
import ctypes
import os

import safetensors
import torch
from safetensors import TensorSpec
from safetensors.torch import save

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "safetensors")


def f4_file():
    # torch's frontend has no F4 name; safetensors.serialize takes raw specs.
    buffers = []

    def spec(dtype, shape, data):
        buf = ctypes.create_string_buffer(data, len(data))
        buffers.append(buf)
        return TensorSpec(dtype=dtype, shape=shape, data_ptr=ctypes.addressof(buf), data_len=len(data))

    return safetensors.serialize(
        {
            "packed": spec("float4_e2m1fn_x2", [2], b"\x12\x34"),  # logical shape [4]
            "mask": spec("bool", [2], b"\x01\x00"),
            "ids": spec("uint8", [3], b"abc"),
        },
        {"format": "pt"},
    )


def main():
    os.makedirs(OUT, exist_ok=True)
    seeds = {
        "basic": save(
            {
                "w32": (torch.arange(6, dtype=torch.float32) / 4).reshape(2, 3),
                "wbf": torch.tensor([1.0, -2.5, 3.140625], dtype=torch.bfloat16),
                "ids": torch.tensor([[-1, 2**40]], dtype=torch.int64),
            },
            metadata={"format": "pt"},
        ),
        "scalar_empty": save(
            {"scalar": torch.tensor(7.5), "empty": torch.zeros(0, dtype=torch.int64), "none": torch.zeros(3, 0)}
        ),
        "all_dtypes": save(
            {
                str(dtype).replace("torch.", ""): torch.zeros(2, dtype=dtype)
                for dtype in [
                    torch.bool, torch.uint8, torch.int8, torch.int16, torch.uint16, torch.int32, torch.uint32,
                    torch.int64, torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64,
                    torch.complex64, torch.float8_e5m2, torch.float8_e4m3fn, torch.float8_e8m0fnu,
                    torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
                ]
            },
            metadata={"format": "pt"},
        ),
        "f4": bytes(f4_file()),
    }
    for name, data in seeds.items():
        safetensors.deserialize(data)  # loads back (torch's load lacks F8_E8M0 and F4)
        with open(os.path.join(OUT, name + ".safetensors"), "wb") as f:
            f.write(data)
        print(f"{name}.safetensors: {len(data)} bytes")


if __name__ == "__main__":
    main()
