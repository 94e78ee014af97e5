"""How many images a job wants, how many repeats make a sensible epoch, and which
bucket sd-scripts puts an image in. Pure functions; no file access.

Image counts come from the guides the project started from (docs/seeds, "Quantas imagens
de treinamento preciso?"): characters 10-20 good images, styles 50-200; quality over
quantity. Concepts (an object, an outfit, a pose) are taught like characters. The wider
"fine" band (15-50 for a character) is common community practice: more varied images
help as long as they are good ones.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from kohya_tuner.errors import UserError
from kohya_tuner.families import Family
from kohya_tuner.resources import presets_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# sd-scripts dataset defaults at the pinned commit (dataset config schema).
DEFAULT_MIN_BUCKET_RESO = 256
DEFAULT_MAX_BUCKET_RESO = 1024


@dataclass(frozen=True)
class JobGuidance:
    job: str
    label: str
    ideal: tuple[int, int]  # the guides' range
    fine: tuple[int, int]  # still trains well
    too_few: int  # below this the LoRA mostly memorises
    # Epochs a run of this job is cut into, so that per-epoch saves give a handful of
    # checkpoints to choose the best from.
    epochs: int = 10


JOBS: dict[str, JobGuidance] = {
    "character": JobGuidance("character", "a character or person", (10, 20), (10, 50), 5),
    "concept": JobGuidance("concept", "a concept (object, outfit, pose)", (10, 20), (10, 50), 5),
    "style": JobGuidance("style", "an art style", (50, 200), (50, 300), 20),
}

_JOB_ALIASES = {
    "person": "character", "face": "character", "subject": "character", "likeness": "character",
    "object": "concept", "product": "concept", "clothing": "concept", "outfit": "concept", "pose": "concept",
    "art": "style", "artstyle": "style", "aesthetic": "style",
}


def get_job(name: str) -> JobGuidance:
    key = name.strip().lower().replace("-", "").replace("_", "").replace(" ", "")
    key = _JOB_ALIASES.get(key, key)
    if key in JOBS:
        return JOBS[key]
    raise UserError(f"Unknown job {name!r}.", f"Choose one of: {', '.join(JOBS)}.")


def count_verdict(unique_images: int, job: str | None) -> tuple[str, str, str | None]:
    """(severity, message, fix) for how many distinct trainable images there are."""
    n = unique_images
    if job is None:
        if n < 5:
            return "warn", f"Only {n} distinct image(s): too few for any LoRA.", "Collect at least 10 good images."
        return "pass", f"{n} distinct images (give --job to compare with what the job needs).", None
    g = get_job(job)
    lo, hi = g.ideal
    flo, fhi = g.fine
    if n < g.too_few:
        return ("warn", f"Only {n} distinct image(s) for {g.label}; {lo}-{hi} good images are the guide.",
                f"Add more varied images; with fewer than {g.too_few} the LoRA copies these pictures instead of "
                "learning what they have in common.")
    if n < flo:
        return ("warn", f"{n} distinct images for {g.label}: on the low side ({lo}-{hi} is the guide).",
                "A few more varied images help more than more steps.")
    if lo <= n <= hi:
        return "pass", f"{n} distinct images for {g.label}: in the {lo}-{hi} range the guides recommend.", None
    if n <= fhi:
        return "pass", f"{n} distinct images for {g.label} (guide {lo}-{hi}; up to {fhi} good ones is fine).", None
    return ("warn", f"{n} distinct images for {g.label}: more than needed (guide {lo}-{hi}).",
            "Quality beats quantity: keep the best, most varied images; near-identical shots over-weight one look.")


def suggest_repeats(image_count: int, job: str | None, target_steps: int, batch: int = 1,
                    epochs: int | None = None) -> int:
    """`num_repeats` so that `target_steps` optimiser steps span about the job's epoch count.

    sd-scripts runs image_count x repeats samples per epoch, i.e. ceil(that / batch) steps.
    Repeats do not change what a step costs; they decide how long an epoch is, and so how
    many per-epoch checkpoints (and caption shuffles) the run gets. Always at least 1."""
    if image_count <= 0 or target_steps <= 0:
        return 1
    batch = max(1, int(batch))
    if epochs is None:
        epochs = get_job(job).epochs if job else 10
    epochs = max(1, int(epochs))
    samples_per_epoch = target_steps * batch / epochs
    repeats = round(samples_per_epoch / image_count)
    return int(min(max(repeats, 1), 100))


def steps_per_epoch(image_count: int, repeats: int, batch: int = 1) -> int:
    return math.ceil(max(0, image_count) * max(1, repeats) / max(1, batch))


# ---- buckets ------------------------------------------------------------------------


def bucket_list(resolution: int, min_bucket: int = DEFAULT_MIN_BUCKET_RESO,
                max_bucket: int = DEFAULT_MAX_BUCKET_RESO, step: int = 64) -> list[tuple[int, int]]:
    """The bucket sizes sd-scripts makes for a square training resolution: every width
    from min to max in `step`s, paired with the tallest multiple of `step` that keeps the
    area within resolution² and the side within max, plus the transposes."""
    area = resolution * resolution
    max_bucket = max(max_bucket, resolution)
    buckets = {(resolution // step * step,) * 2}
    width = min_bucket
    while width <= max_bucket:
        height = min(max_bucket, area // width // step * step)
        if height >= min_bucket:
            buckets.add((width, height))
            buckets.add((height, width))
        width += step
    return sorted(buckets)


def max_bucket_aspect(resolution: int, min_bucket: int = DEFAULT_MIN_BUCKET_RESO,
                      max_bucket: int = DEFAULT_MAX_BUCKET_RESO, step: int = 64) -> float:
    return max(max(w, h) / min(w, h) for w, h in bucket_list(resolution, min_bucket, max_bucket, step))


def bucket_for(width: int, height: int, buckets: list[tuple[int, int]]) -> tuple[int, int]:
    """The bucket whose aspect ratio is closest to the image's, as sd-scripts picks it."""
    ar = width / height
    return min(buckets, key=lambda b: abs(b[0] / b[1] - ar))


def bucket_scale(width: int, height: int, bucket: tuple[int, int]) -> float:
    """How much the image is scaled to cover its bucket (>1 is an upscale)."""
    return max(bucket[0] / width, bucket[1] / height)


def largest_bucket_side(resolution: int, min_bucket: int = DEFAULT_MIN_BUCKET_RESO,
                        max_bucket: int = DEFAULT_MAX_BUCKET_RESO, step: int = 64) -> int:
    return max(max(b) for b in bucket_list(resolution, min_bucket, max_bucket, step))


@dataclass(frozen=True)
class BucketPlan:
    """The training size and bucket range images are judged (and prepared) against."""

    resolution: int
    min_bucket: int
    max_bucket: int
    step: int
    no_upscale: bool

    def buckets(self) -> list[tuple[int, int]]:
        return bucket_list(self.resolution, self.min_bucket, self.max_bucket, self.step)

    @property
    def max_aspect(self) -> float:
        return max(max(b) / min(b) for b in self.buckets())

    @property
    def largest_side(self) -> int:
        return max(max(b) for b in self.buckets())


@lru_cache(maxsize=None)
def _preset_layers(family: str) -> tuple[dict[str, Any], ...]:
    """The model preset's settings, then each GPU class's, for `family` (packaged data)."""
    layers: list[dict[str, Any]] = []
    try:
        with open(presets_dir() / "models" / f"{family}.toml", "rb") as fh:
            layers.append(dict(tomllib.load(fh).get("settings") or {}))
        with open(presets_dir() / "gpu" / f"{family}.toml", "rb") as fh:
            for table in tomllib.load(fh).values():
                if isinstance(table, dict):
                    layers.append(dict(table.get("settings") or {}))
    except (OSError, ValueError):
        pass
    return tuple(layers)


def _as_int(value: Any) -> int | None:
    try:
        return int(str(value).split(",")[0])
    except (TypeError, ValueError):
        return None


def planned_buckets(family: Family | None, resolution: int | None = None, min_bucket: int | None = None,
                    max_bucket: int | None = None, no_upscale: bool | None = None) -> BucketPlan:
    """What a kohya-tuner plan for `family` trains at: the model preset's resolution and
    bucket range (sd-scripts' defaults where a preset is silent), overridden by the
    arguments, and made consistent the way sd-scripts requires (min <= resolution <= max)."""
    for flag, value in (("--resolution", resolution), ("--min-bucket", min_bucket), ("--max-bucket", max_bucket)):
        if value is not None and not (isinstance(value, int) and 64 <= value <= 16384):
            from kohya_tuner.errors import UserError

            raise UserError(f"{flag} {value} is not a side in pixels sd-scripts can train at (64 to 16384).")
    model = _preset_layers(family.name)[0] if family and _preset_layers(family.name) else {}
    res = int(resolution or _as_int(model.get("resolution")) or (family.native_resolution if family else 1024))
    lo = int(min_bucket or _as_int(model.get("min_bucket_reso")) or DEFAULT_MIN_BUCKET_RESO)
    hi = int(max_bucket or _as_int(model.get("max_bucket_reso")) or DEFAULT_MAX_BUCKET_RESO)
    step = int(_as_int(model.get("bucket_reso_steps")) or (family.bucket_step if family else 64))
    if no_upscale is None:
        no_upscale = bool(model.get("bucket_no_upscale", False))
    return BucketPlan(res, min(lo, res), max(hi, res), step, bool(no_upscale))


def largest_planned_side(family: Family) -> int:
    """The longest bucket side any preset for `family` can train at (model layer and
    every GPU class), so a prepared copy keeps every pixel any plan could use."""
    layers = _preset_layers(family.name)
    if not layers:
        return planned_buckets(family).largest_side
    base = layers[0]
    best = 0
    for layer in layers:
        merged = {**base, **layer}
        plan = planned_buckets(family, _as_int(merged.get("resolution")), _as_int(merged.get("min_bucket_reso")),
                               _as_int(merged.get("max_bucket_reso")))
        best = max(best, plan.largest_side)
    return best
