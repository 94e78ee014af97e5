"""The sd-scripts argument schema at the pinned commit: names, types, choices, defaults.

The schema is `vendor/sd-scripts/args.json`. It is read on first use, never at import,
so commands that do not validate anything do not pay for it (json parses the 0.5 MB
file in a few milliseconds; `benchmarks/check_startup.py` prints the figure).
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any

from kohya_tuner.errors import UserError
from kohya_tuner.printable import short_repr
from kohya_tuner.resources import vendor_file

INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class ArgSpec:
    name: str
    type: str
    default: Any = None
    choices: tuple | None = None
    nargs: str | None = None
    toml: str = ""
    item_type: str | None = None
    cli_only: bool = False
    secret: bool = False
    desc: str = ""
    source: str = ""

    @property
    def is_flag(self) -> bool:
        return self.type == "bool-store_true"


_SPEC_FIELDS = frozenset(f.name for f in fields(ArgSpec))


def _spec(raw: dict[str, Any]) -> ArgSpec:
    kw = {k: v for k, v in raw.items() if k in _SPEC_FIELDS}
    if kw.get("choices") is not None:
        kw["choices"] = tuple(kw["choices"])
    return ArgSpec(**kw)


@lru_cache(maxsize=None)
def raw_schema() -> dict[str, Any]:
    with open(vendor_file("sd-scripts", "args.json"), encoding="utf-8") as fh:
        return json.load(fh)


@lru_cache(maxsize=None)
def script_args(script: str) -> dict[str, ArgSpec]:
    scripts = raw_schema()["scripts"]
    if script not in scripts:
        raise UserError(f"sd-scripts has no entry script {script!r} at the pinned commit.")
    return {a["name"]: _spec(a) for a in scripts[script]["args"]}


@lru_cache(maxsize=None)
def defaults(script: str) -> dict[str, Any]:
    return {name: spec.default for name, spec in script_args(script).items()}


def pinned_commit() -> str:
    return raw_schema()["upstream"]["commit"]


def closest_key(key: str, candidates) -> str | None:
    found = difflib.get_close_matches(key, list(candidates), n=1, cutoff=0.6)
    if not found:
        # Users often write dashes or CLI flags; sd-scripts keys are argparse dests.
        norm = key.lstrip("-").replace("-", "_")
        if norm != key and norm in candidates:
            return norm
    return found[0] if found else None


_RES_RE = re.compile(r"^\s*\d+\s*(,\s*\d+\s*)*$")


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def not_finite(v: Any) -> bool:
    return isinstance(v, float) and not math.isfinite(v)


def check_value(spec: ArgSpec, value: Any) -> str | None:
    """Why `value` is not what the script would see after CLI parsing, or None."""
    found = classify_value(spec, value)
    return found[1] if found else None


def classify_value(spec: ArgSpec, value: Any) -> tuple[str, str] | None:
    """(kind, why) when `value` is not what argparse would have produced, else None.

    kind: "type" (the code computes with a value of the wrong kind: it breaks), "truthy" (a
    store_true flag holding a non-boolean: Python's truthiness decides), "fraction" (a float
    of 1 or more where sd-scripts reads a float as a fraction of all steps), "choices" (outside
    argparse's choices, which only a command-line value is checked against)."""
    t = spec.type
    if t == "bool-store_true":
        if not isinstance(value, bool):
            on = "on" if value else "off"
            return "truthy", (f"must be true or false, not {short_repr(value)}; sd-scripts tests it for truth, so this turns "
                              f"{spec.name} {on}")
    elif t == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            return "type", f"must be an integer, not {short_repr(value)}"
    elif t == "float":
        if not is_number(value):
            return "type", f"must be a number, not {short_repr(value)}"
    elif t == "int_or_float":
        if not is_number(value):
            return "type", f"must be an integer step count or a fraction below 1, not {short_repr(value)}"
        if not_finite(value):
            return None  # the range check names it
        if isinstance(value, float) and value >= 1:
            return "fraction", (f"{short_repr(value)} is a float, which sd-scripts reads as a fraction of all steps "
                                f"({value:g} x the total); write an integer ({int(value)}) for a step count")
    elif t == "str":
        if not isinstance(value, str):
            if spec.name in ("resolution", "face_crop_aug_range"):
                return "type", (f"must be written as a string in --config_file (e.g. \"1024\" or \"1024,768\"), "
                                f"not {short_repr(value)}; sd-scripts crashes on a number or array here")
            return "type", f"must be a string, not {short_repr(value)}"
        if spec.name == "resolution" and not _RES_RE.match(value):
            return "type", f"must look like \"1024\" or \"1024,768\", not {short_repr(value)}"
    elif t == "list":
        if spec.name == "text_encoder_lr" and is_number(value):
            return None
        if not isinstance(value, list):
            return "type", f"must be an array, not {short_repr(value)}"
        kinds = {type(v) for v in value}
        if len(kinds) > 1 and kinds != {int, float}:
            return "type", "must hold values of one type (the toml 0.10.2 parser sd-scripts uses rejects mixed arrays)"
        if len(kinds) > 1:
            return "type", "mixes integers and floats; toml 0.10.2 rejects such arrays, write every item with a decimal point"
        item = spec.item_type or "str"
        for v in value:
            if item == "str" and not isinstance(v, str):
                return "type", f"items must be strings like \"key=value\", not {short_repr(v)}"
            if item == "float" and not is_number(v):
                return "type", f"items must be numbers, not {short_repr(v)}"
    if spec.choices and value not in spec.choices:
        allowed = ", ".join(repr(c) for c in spec.choices if c is not None)
        return "choices", f"{short_repr(value)} is not one of {allowed}"
    return None
