"""Measured peaks of past runs, per GPU, and the correction they imply for the estimator.

Every successful run appends one line to `<user data dir>/history.jsonl`: the GPU, the model
family, a fingerprint of the memory-relevant settings, what the estimator predicted and what
NVML measured. `correction()` turns the runs on the same GPU and model into one factor
(measured / predicted) that `memory.estimate` applies when given the history.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Iterable

from pydantic import BaseModel, ValidationError

from kohya_tuner.resources import user_data_dir

HISTORY_FILE = "history.jsonl"

# Settings that change the memory a run needs (and nothing else), for the fingerprint.
MEMORY_KEYS = (
    "mixed_precision", "full_bf16", "full_fp16", "fp8_base", "fp8_base_unet", "gradient_checkpointing",
    "cpu_offload_checkpointing", "blocks_to_swap", "split_mode", "xformers", "sdpa", "mem_eff_attn",
    "cache_latents", "cache_latents_to_disk", "cache_text_encoder_outputs", "cache_text_encoder_outputs_to_disk",
    "network_dim", "network_args", "network_train_unet_only", "network_train_text_encoder_only", "optimizer_type",
    "optimizer_args", "train_batch_size", "resolution", "t5xxl_max_token_length", "max_token_length",
    "vae_batch_size", "no_half_vae", "lowram", "highvram", "sample_prompts", "sample_every_n_steps",
    "sample_every_n_epochs", "sample_at_first", "use_8bit_adam", "use_lion_optimizer",
)

# A factor outside this range means the run was not comparable (another process, a crash
# before the peak); it is clipped rather than trusted.
MIN_FACTOR = 0.8
MAX_FACTOR = 1.5


class HistoryEntry(BaseModel):
    time: float
    gpu_name: str
    gpu_total_gib: float | None = None
    model: str
    fingerprint: str = ""
    predicted_gib: float
    measured_peak_gib: float


def history_path() -> Path:
    return user_data_dir() / HISTORY_FILE


def fingerprint(config: dict[str, Any], family: Any = None, dataset: dict[str, Any] | None = None) -> str:
    """A short stable hash of the memory-relevant settings (and the dataset's batch size and
    resolution, which win over the config's)."""
    from kohya_tuner.memory.setup import dataset_batch_and_area

    picked = {k: config.get(k) for k in MEMORY_KEYS if config.get(k) not in (None, False, "", [])}
    batch, res, _ = dataset_batch_and_area(config, dataset)
    picked["_batch"] = batch
    picked["_resolution"] = list(res) if res else None
    picked["_family"] = getattr(family, "name", family)
    text = json.dumps(picked, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def append(entry: HistoryEntry | dict[str, Any], path: str | os.PathLike | None = None) -> Path:
    """Add one run. Appending a single line keeps earlier lines intact even if two runs
    finish at once."""
    if isinstance(entry, dict):
        data = dict(entry)
        data.setdefault("time", time.time())
        entry = HistoryEntry.model_validate(data)
    p = Path(path) if path else history_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a", encoding="utf-8") as fh:
        fh.write(entry.model_dump_json() + "\n")
    return p


def load(path: str | os.PathLike | None = None) -> list[HistoryEntry]:
    """Every readable entry; damaged lines are skipped, a missing file is an empty history."""
    p = Path(path) if path else history_path()
    try:
        from kohya_tuner import safeio

        text = safeio.read_regular(p, 64 << 20).decode("utf-8", "replace")
    except OSError:  # absent, unreadable, not a regular file, or beyond any real history
        return []
    out: list[HistoryEntry] = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            out.append(HistoryEntry.model_validate_json(line))
        except (ValidationError, ValueError):
            continue
    return out


def _as_entry(e: Any) -> HistoryEntry | None:
    if isinstance(e, HistoryEntry):
        return e
    try:
        return HistoryEntry.model_validate(e)
    except ValidationError:
        return None


def correction(entries: Iterable[Any], gpu_name: str | None, model: str, *,
               fingerprint: str | None = None) -> tuple[float, int]:
    """(factor, n): the median measured/predicted ratio of the runs on this GPU and model,
    from the runs with the same settings when there are any. A factor below 1 (the model
    over-predicts) needs two runs before it is used: one run that happened to stay low must
    not shrink the margin. (1.0, 0) when nothing applies."""
    if not gpu_name:
        return 1.0, 0
    want = gpu_name.strip().lower()
    same: list[HistoryEntry] = []
    for raw in entries:
        e = _as_entry(raw)
        if e is None or e.model != model or e.gpu_name.strip().lower() != want:
            continue
        if e.predicted_gib > 0 and e.measured_peak_gib > 0:
            same.append(e)
    if not same:
        return 1.0, 0
    if fingerprint:
        exact = [e for e in same if e.fingerprint == fingerprint]
        if exact:
            same = exact
    ratios = [e.measured_peak_gib / e.predicted_gib for e in same]
    factor = statistics.median(ratios)
    factor = min(MAX_FACTOR, max(MIN_FACTOR, factor))
    if factor < 1.0 and len(ratios) < 2:
        return 1.0, 0
    return factor, len(ratios)
