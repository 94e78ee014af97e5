"""Writes state folders laid out as accelerate 1.6 writes them for sd-scripts (a valid
safetensors file, zip archives for the optimizer and scheduler as torch.save makes them,
the random states, train_state.json), for tests that need states on disk."""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path


def write_state(d: Path, step: int, epoch: int = 1) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    for name in ("optimizer.bin", "scheduler.bin"):
        with zipfile.ZipFile(d / name, "w") as z:
            z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
    (d / "random_states_0.pkl").write_bytes(b"\x80\x02}q\x00.")
    (d / "train_state.json").write_text(json.dumps({"current_epoch": epoch, "current_step": step}))
    return d
