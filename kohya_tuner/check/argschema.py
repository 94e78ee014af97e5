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
    return _closest(key, tuple(candidates))


@lru_cache(maxsize=1 << 17)  # a 1 MB config holds fewer keys than this
def _closest(key: str, candidates: tuple[str, ...]) -> str | None:
    # Cached: the fit validates every candidate config, each holding the same unknown keys.
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

    kind: "type" (the code computes with a value of the wrong kind: it breaks), "bool_int" (true or
    false for an integer: Python computes with 1 or 0), "truthy" (a
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
        if isinstance(value, bool):
            # A bool is an int to Python and to sd-scripts' schema: the code computes with 1 or 0.
            return "bool_int", f"must be an integer, not {short_repr(value)}; Python counts it as {int(value)}"
        if not isinstance(value, int):
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


# sd-scripts checks the whole argparse namespace, --config_file values and unknown keys included,
# against its dataset schema before it builds the datasets (config_util.py:410 ->
# sanitize_argparse_namespace, 382): the [general]-level dataset keys, three of argparse's own, and
# two argparse names mapped onto dataset keys. resolution and face_crop_aug_range are absent here:
# prepare_dataset_args has converted them by then, and their own rules judge the written form.
_NAMESPACE_EXTRA = {"debug_dataset": ["bool"], "max_token_length": ["int"], "prior_loss_weight": ["float", "int"],
                    "train_batch_size": ["int"], "dataset_repeats": ["int"]}
_CONVERTED_FIRST = ("resolution", "face_crop_aug_range")
# Keys only the DreamBooth-capable sanitizers put in the general schema (config_util.py:350);
# fine_tune.py builds its sanitizer without DreamBooth support.
_DREAMBOOTH_ONLY = ("caption_extension", "class_tokens", "cache_info")


@lru_cache(maxsize=None)
def namespace_schema(script: str) -> dict[str, tuple[str, ...]]:
    """Key -> the types sd-scripts' namespace validator accepts for it, for `script`."""
    keys = raw_schema()["dataset_config"]["keys"]
    out = {k: tuple(v["accepts"]) for k, v in keys.items()
           if "general" in v["levels"] and k not in _CONVERTED_FIRST
           and not (script == "fine_tune.py" and k in _DREAMBOOTH_ONLY)}
    out.update({k: tuple(v) for k, v in _NAMESPACE_EXTRA.items()})
    return out


_VOLUPTUOUS = {
    # voluptuous checks a type with isinstance: a bool is an int, an int is no float.
    "bool": lambda v: isinstance(v, bool),
    "int": lambda v: isinstance(v, int),
    "float": lambda v: isinstance(v, float),
    "str": lambda v: isinstance(v, str),
    "table": lambda v: isinstance(v, dict),
}
_TYPE_WORDS = {"bool": "true or false", "int": "an integer", "float": "a number with a decimal point",
               "str": "a string", "table": "a table"}


def namespace_type_why(accepts: tuple[str, ...], value: Any) -> str | None:
    """Why voluptuous refuses `value` for a key accepting `accepts` (None: it passes; so does
    None, which voluptuous' Object validator skips)."""
    if value is None or any(_VOLUPTUOUS.get(a, lambda v: True)(value) for a in accepts):
        return None
    want = " or ".join(_TYPE_WORDS.get(a, a) for a in accepts)
    hint = " (write 1.0, not 1)" if accepts == ("float",) and is_number(value) else ""
    return f"must be {want}{hint}, not {short_repr(value)}"
