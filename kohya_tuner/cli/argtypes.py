"""argparse types for numeric flags: finite numbers in range, or a clear refusal.

float("nan"), float("inf") and "1e400" all parse as floats; every flag here refuses them so
no NaN reaches a comparison or an int() further down.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Callable


def finite_float(low: float | None = None, high: float | None = None, *, low_open: bool = False,
                 what: str = "a number") -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if low is not None and (value <= low if low_open else value < low):
            raise argparse.ArgumentTypeError(f"{text} must be {'above' if low_open else 'at least'} {low:g}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{text} must be at most {high:g}")
        return value

    parse.__name__ = "number"
    return parse


def int_range(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if low is not None and value < low:
            raise argparse.ArgumentTypeError(f"{text} must be at least {low}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{text} must be at most {high}")
        return value

    parse.__name__ = "whole number"
    return parse


# int64, the widest step counter sd-scripts' torch-side code can hold.
INT64_MAX = 2**63 - 1
positive_int = int_range(1, INT64_MAX)
steps_int = int_range(1, INT64_MAX)


def utf8_text(text: str) -> str:
    """A word that goes into files (a trigger, a name): bytes that are not UTF-8 in the
    command line (kept by Python as lone surrogates) cannot be written into a caption or config."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(
            f"{text.encode('utf-8', 'surrogateescape').decode('utf-8', 'replace')!r} holds bytes that are not "
            "UTF-8; captions and configs are UTF-8 files") from None
    return text


utf8_text.__name__ = "text"

# A process's exit status as any platform reports it: negative for a signal (Python's
# subprocess), up to 2**32 - 1 on Windows (0xC0000005 and the like).
exit_status = int_range(-(2**31), 2**32 - 1)


def gpu_size(text: str) -> str:
    """'auto' or a finite card size in GB; kohya_tuner.gpu turns it into a class."""
    if text.strip().lower() == "auto":
        return "auto"
    from kohya_tuner.errors import UserError
    from kohya_tuner.gpu import parse_gb

    try:
        parse_gb(text)
    except UserError as exc:
        raise argparse.ArgumentTypeError(exc.paragraph().removeprefix("--gpu ").rstrip(".")) from None
    return text


def out_path(text: str) -> Path:
    """A folder or file to write: '' is refused (Path('') is the current folder, so an
    empty variable in a script would write the plan where the user stands)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must name a folder or file, not an empty string "
                                         "(use . to mean the current folder)")
    return Path(text)
