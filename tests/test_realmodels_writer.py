"""The streaming safetensors writers of tools/realmodels/: the file layout the format specifies
(8-byte header length, JSON header with dtypes, shapes and offsets, 8-byte aligned data), every
tensor's bytes back as written, 0-dim and empty tensors included; the FLUX.1 builder's tensors,
made one at a time, in bf16 and fp8 e4m3 with the values the builder promises."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "realmodels"))
import build_flux_random as flux_builder  # noqa: E402
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


def _read(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert n % 8 == 0
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def test_flux_builder_writes_each_tensor_as_it_makes_it(tmp_path):
    specs = [("blocks.0.norm.scale", (64,)), ("blocks.0.lin.bias", (48,)), ("blocks.0.lin.weight", (48, 64)),
             ("conv.weight", (8, 4, 3, 3)), ("shared.weight", (100, 64))]
    for dtype, code in ((torch.bfloat16, "BF16"), (torch.float8_e4m3fn, "F8_E4M3")):
        path = tmp_path / f"{code}.safetensors"
        assert flux_builder.stream_write(specs, dtype, path, seed=3, metadata={"kind": "random"}) == len(specs)
        assert not list(tmp_path.glob("partial-*"))
        header, data = _read(path)
        assert header.pop("__metadata__") == {"kind": "random"}
        assert list(header) == [name for name, _ in specs]
        assert len(data) == header["shared.weight"]["data_offsets"][1]
        back = {}
        for name, shape in specs:
            h = header[name]
            assert h["dtype"] == code and h["shape"] == list(shape)
            begin, end = h["data_offsets"]
            back[name] = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype).reshape(shape).float()
        assert torch.equal(back["blocks.0.norm.scale"], torch.ones(64))  # a norm scale starts at 1
        assert torch.equal(back["blocks.0.lin.bias"], torch.zeros(48))
        for name in ("blocks.0.lin.weight", "conv.weight", "shared.weight"):
            w = back[name]
            assert torch.isfinite(w).all() and w.std() > 0, name
            fan_in = w[0].numel()
            # fp8: below 1.875 * 2**-6; bf16: drawn at 1/sqrt(fan_in), nothing past 6 sigma.
            bound = 1.875 * 2**-6 if code == "F8_E4M3" else 6 / fan_in**0.5
            assert w.abs().max() <= bound, (name, float(w.abs().max()))
        again = tmp_path / "again.safetensors"
        flux_builder.stream_write(specs, dtype, again, seed=3)
        assert _read(again)[1] == data  # the seed decides the values
