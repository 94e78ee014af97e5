"""The streaming safetensors writer of tools/realmodels/build_sdxl_random.py: the file layout the
format specifies (8-byte header length, JSON header with dtypes, shapes and offsets, 8-byte aligned
data), every tensor's bytes back as written, 0-dim and empty tensors included."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "realmodels"))
import build_sdxl_random as builder  # noqa: E402


def test_streamed_file_reads_back_tensor_for_tensor(tmp_path):
    tensors = {"unet.w": torch.randn(3, 5).bfloat16(), "logit_scale": torch.tensor(4.6, dtype=torch.bfloat16),
               "vae.b": torch.randn(7).half(), "empty": torch.zeros(0), "t": torch.randn(2, 2)[:, 1]}
    path = tmp_path / "m.safetensors"
    builder.stream_save_file(tensors, path, {"kind": "random"})
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert n % 8 == 0
    header = json.loads(raw[8:8 + n])
    assert header.pop("__metadata__") == {"kind": "random"}
    data = raw[8 + n:]
    assert set(header) == set(tensors) and len(data) == max(h["data_offsets"][1] for h in header.values())
    dtypes = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
    for name, t in tensors.items():
        h = header[name]
        assert h["shape"] == list(t.shape)
        begin, end = h["data_offsets"]
        back = torch.frombuffer(bytearray(data[begin:end]) or bytearray(0), dtype=dtypes[h["dtype"]]) \
            if end > begin else torch.zeros(0, dtype=dtypes[h["dtype"]])
        assert torch.equal(back.reshape(t.shape), t.contiguous()), name
