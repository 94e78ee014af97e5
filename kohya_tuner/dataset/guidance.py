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
from dataclasses import dataclass

from kohya_tuner.errors import UserError

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
    "style": JobGuidance("style", "an art style", (50, 200), (30, 300), 20),
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
                f"Add more varied images (angles, lighting, backgrounds); with fewer than {g.too_few} the LoRA copies "
                "them instead of learning the subject.")
    if n < flo:
        return ("warn", f"{n} distinct images for {g.label}: on the low side ({lo}-{hi} is the guide).",
                "A few more varied images help more than more steps.")
    if lo <= n <= hi:
        return "pass", f"{n} distinct images for {g.label}: in the {lo}-{hi} range the guides recommend.", None
    if n <= fhi:
        return "pass", f"{n} distinct images for {g.label} (guide {lo}-{hi}; up to {fhi} of good quality is fine).", None
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
