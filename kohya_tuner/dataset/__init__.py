"""Dataset checks and preparation.

    scan(path)                          every image and caption, with per-file problems
    check(path, job, family, ...)       scan() judged for a job, model family and resolution
    prepare(src, out, family, ...)      a trainable copy; the originals are never touched
    find_prepared(src)                  that copy, when it is complete and up to date
    suggest_repeats(n, job, steps, b)   num_repeats for the dataset TOML
    layout(path), count_images(path)    subsets and image counts from file names (instant)
"""

from __future__ import annotations

from kohya_tuner.dataset.checks import PROBLEMS, check, count_images, evaluate, layout, scan
from kohya_tuner.dataset.guidance import (
    JOBS,
    bucket_for,
    bucket_list,
    count_verdict,
    get_job,
    largest_bucket_side,
    max_bucket_aspect,
    steps_per_epoch,
    suggest_repeats,
)
from kohya_tuner.dataset.models import DatasetReport, Finding, ImageInfo, PrepItem, PrepResult, Subset
from kohya_tuner.dataset.prepare import PreparedCopy, default_max_side, find_prepared, prepare, prepared_copy
from kohya_tuner.dataset.walk import MANIFEST_NAME

__all__ = [
    "JOBS", "MANIFEST_NAME", "PROBLEMS", "DatasetReport", "Finding", "ImageInfo", "PrepItem", "PrepResult",
    "PreparedCopy", "Subset", "bucket_for", "bucket_list", "check", "count_images", "count_verdict",
    "default_max_side", "evaluate", "find_prepared", "get_job", "largest_bucket_side", "layout", "max_bucket_aspect",
    "prepare", "prepared_copy", "scan", "steps_per_epoch", "suggest_repeats",
]
