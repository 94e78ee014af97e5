"""The one JSON encoder for everything kohya-tuner writes as JSON (every `--json` output,
the run journal, events): strict JSON, which Python's default is not.

`json.dumps` writes NaN and Infinity as the bare words `NaN`/`Infinity`, which strict
parsers (JavaScript's JSON.parse, jq, Go, Rust's serde) reject. A non-finite number here
is written as null: a diverged loss has no value to report, and readers already treat a
missing measurement as null.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import PurePath
from typing import Any


def finite(data: Any) -> Any:
    """`data` with every non-finite float replaced by None (containers copied, not changed)."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [finite(v) for v in data]
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        return finite(dataclasses.asdict(data))
    return data


def _default(obj: Any) -> Any:
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=str)
    if isinstance(obj, PurePath):
        return str(obj)
    return str(obj)


def dumps(data: Any, *, indent: int | None = None, ensure_ascii: bool = False, **kw: Any) -> str:
    """Strict JSON text of `data`: non-finite numbers as null, anything else unknown as its str()."""
    return json.dumps(finite(data), indent=indent, ensure_ascii=ensure_ascii, allow_nan=False,
                      default=lambda o: finite(_default(o)), **kw)
