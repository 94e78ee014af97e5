"""The one quoting layer for every TOML file kohya-tuner writes.

sd-scripts reads its files with `toml` 0.10.2, which misreads some valid TOML: a basic
string that is only a double quote comes back empty, a `'` inside an inline table in an
array drops the table, a comma inside a string in an array splits it. So each string is
written in the first of TOML's four string forms that this parser reads back exactly in
the place it will stand, and the whole file is parsed again before it is returned. A value
no form can carry is refused with the key named, never written wrong.
"""

from __future__ import annotations

import math
from typing import Any

import toml

from kohya_tuner.errors import UserError

_BARE = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def _basic(s: str) -> str:
    out = []
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\u{o:04x}")
        else:
            out.append(ch)
    return "".join(out)


def _forms(s: str) -> list[str]:
    ctrl = any(ord(c) < 0x20 or ord(c) == 0x7F for c in s)
    forms = [f'"{_basic(s)}"']
    if not ctrl and "'" not in s:
        forms.append(f"'{s}'")
    forms.append(f'"""{_basic(s)}"""')
    if not ctrl and "'''" not in s and not s.endswith("'"):
        forms.append(f"'''{s}'''")
    return forms


def _reads_back(snippet: str, want: Any, get) -> bool:
    try:
        return get(toml.loads(snippet)) == want
    except Exception:  # toml 0.10.2 raises many kinds on text it cannot read
        return False


def _key(k: str) -> str:
    if k and all(c in _BARE for c in k):
        return k
    return f'"{_basic(k)}"'


def _scalar(v: Any, where: str, in_array: bool) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise UserError(f"{where} = {v} cannot be written: sd-scripts' TOML parser has no {v}.")
        return repr(v)
    if isinstance(v, str):
        for form in _forms(v):
            # Tried where it will stand: twice in an array (commas are where 0.10.2 errs), or alone.
            snippet = f"k = [{form}, {form}]\n" if in_array else f"k = {form}\n"
            if _reads_back(snippet, [v, v] if in_array else v, lambda d: d.get("k")):
                return form
        raise UserError(f"{where} = {v!r} cannot be written so that sd-scripts' TOML parser (toml 0.10.2) "
                        "reads it back unchanged" + (" (it breaks strings holding a comma inside a list)"
                                                     if in_array and "," in v else "") + ".",
                        "Choose a value (a folder name, a trigger word) without that character.")
    raise UserError(f"{where} holds a {type(v).__name__}, which a TOML config cannot carry.")


def _value(v: Any, where: str) -> str:
    if isinstance(v, (list, tuple)):
        if any(isinstance(x, (list, tuple, dict)) for x in v):
            raise UserError(f"{where} is a nested list, which sd-scripts' settings never are.")
        return "[" + ", ".join(_scalar(x, where, True) for x in v) + "]"
    return _scalar(v, where, False)


def _is_table_list(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _table(doc: dict[str, Any], path: list[str], out: list[str]) -> None:
    for k, v in doc.items():
        if v is None or isinstance(v, dict) or _is_table_list(v):
            continue
        out.append(f"{_key(k)} = {_value(v, '.'.join(path + [k]))}\n")
    for k, v in doc.items():
        if isinstance(v, dict):
            out.append(f"\n[{'.'.join(_key(p) for p in path + [k])}]\n")
            _table(v, path + [k], out)
        elif _is_table_list(v):
            for item in v:
                out.append(f"\n[[{'.'.join(_key(p) for p in path + [k])}]]\n")
                _table(item, path + [k], out)


def dumps(doc: dict[str, Any]) -> str:
    """`doc` as TOML that toml 0.10.2 reads back as `doc` (None values left out)."""
    out: list[str] = []
    _table(doc, [], out)
    return "".join(out).lstrip("\n")


def dumps_pair(key: str, value: Any, where: str | None = None) -> str:
    """One `key = value` line."""
    return f"{_key(key)} = {_value(value, where or key)}\n"


def _drop_none(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _drop_none(v) for k, v in doc.items() if v is not None}
    if isinstance(doc, list):
        return [_drop_none(x) for x in doc]
    return doc


def verify(text: str, want: dict[str, Any], what: str, flat=None) -> None:
    """Refuse a file that would mean something else to sd-scripts (a bug guard: the forms above
    are each checked, so only an unforeseen interaction of lines can trip it)."""
    try:
        back = toml.loads(text)
    except Exception as exc:
        raise UserError(f"The {what} written would not parse in sd-scripts' TOML parser (toml 0.10.2): {exc}.") from None
    if flat is not None:
        back = flat(back)
    want = _drop_none(want)
    if back != want:
        diff = sorted(str(k) for k in set(back) | set(want) if back.get(k) != want.get(k))
        raise UserError(f"The {what} would not read back unchanged through toml 0.10.2 (keys {', '.join(diff)}).",
                        "Choose values without the quote or comma characters those keys hold.")


# ---- the layout of a --config_file -------------------------------------------------

# sd-scripts ignores section names; these only make the file readable. The section of a
# key follows the sd-scripts helper that defines the argument (from args.json).
_SECTION_BY_SOURCE = [
    ("add_sd_models_arguments", "model"),
    ("add_flux_train_arguments", "model"),
    ("add_sdxl_training_arguments", "model"),
    ("add_dit_training_arguments", "memory"),
    ("add_dataset_arguments", "dataset"),
    ("add_optimizer_arguments", "optimizer"),
    ("setup_parser", "network"),
    ("add_training_arguments", "training"),
    ("add_config_arguments", "dataset"),
    ("add_logging_arguments", "logging"),
]
_MEMORY_KEYS = {
    "gradient_checkpointing", "cpu_offload_checkpointing", "mixed_precision", "full_bf16", "full_fp16", "fp8_base",
    "fp8_base_unet", "blocks_to_swap", "cache_latents", "cache_latents_to_disk", "cache_text_encoder_outputs",
    "cache_text_encoder_outputs_to_disk", "xformers", "sdpa", "mem_eff_attn", "vae_batch_size", "lowram", "highvram",
    "train_batch_size", "gradient_accumulation_steps", "max_data_loader_n_workers", "persistent_data_loader_workers",
}
_SAVE_PREFIXES = ("save_", "resume", "skip_until_initial_step", "output_", "sample_")
SECTION_ORDER = ["model", "network", "optimizer", "training", "memory", "dataset", "saving", "logging", "other"]


def section_of(key: str, sources: dict[str, str]) -> str:
    if key in _MEMORY_KEYS:
        return "memory"
    if key.startswith(_SAVE_PREFIXES):
        return "saving"
    src = sources.get(key, "")
    if key.startswith("network_") or key in ("dim_from_weights", "scale_weight_norms"):
        return "network"
    for needle, section in _SECTION_BY_SOURCE:
        if needle in src:
            return section
    return "other"
