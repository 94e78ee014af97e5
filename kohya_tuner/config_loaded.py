"""The one form every reader makes of a config: a flat dict of sd-scripts argument names.

The readers (config_io for TOML, config_cmdline for command lines, config_gui for kohya_ss
GUI files) share the data class and the conversions here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kohya_tuner import safeio, schema
from kohya_tuner.errors import UserError
from kohya_tuner.families import FAMILIES, Family, family_for_config, family_for_script, get_family


@dataclass
class LoadedConfig:
    config: dict[str, Any]
    family: Family | None
    script: str | None
    fmt: str  # "toml" | "kohya_gui_json" | "command_line"
    dataset_path: str | None = None
    notes: list[str] = field(default_factory=list)
    # What the reader had to guess (the model family a file does not state): these belong in the
    # estimate's Assumed list (JSON "assumptions"), not among the reading notes.
    assumptions: list[str] = field(default_factory=list)
    # Values a plan assumes that the file does not set (kohya_tuner.assumed: comments kohya-tuner
    # config wrote), already merged into `config`.
    assumed: dict[str, Any] = field(default_factory=dict)
    # What sd-scripts' argparse refuses in a command line (check.Problem, path "command_line"):
    # found while reading, judged with everything else by `check`.
    problems: list[Any] = field(default_factory=list)
    # A kohya_ss GUI file only: the options the GUI gives `accelerate launch` (mixed_precision,
    # dynamo_backend, num_processes ...), and the keys of the GUI's TOML the entry script does
    # not take (sd-scripts ignores them: epoch, noise_offset_type).
    launch: list[str] = field(default_factory=list)
    ignored: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A dataset_config that is no string (5, a list) is no path to open: the checker names its
        # type; nothing downstream may try to read it.
        if not isinstance(self.dataset_path, str):
            self.dataset_path = None

    @property
    def origin(self) -> str:
        """The path the values take into sd-scripts (docs/check.md, Two paths): a command line
        passes argparse; a TOML, and a GUI file (the GUI launches a TOML), does not."""
        return "command_line" if self.fmt == "command_line" else "config_file"

    def check_args(self) -> dict[str, Any]:
        """The keyword arguments of check.check / check.gate that say how these values arrive."""
        return {"origin": self.origin, "parsed": tuple(self.problems),
                "family": self.family.name if self.family is not None else None}


def guess_family(config: dict[str, Any], script: str | None, model: str | None,
                  weak: list[str] | None = None) -> Family | None:
    """The family a config trains. Evidence only a model's name gives is weak: it is recorded
    in `weak` (when given) so the caller can list the guess as an assumption."""
    if model:
        return get_family(model)
    if script:
        fam = family_for_script(script, config)
        if fam:
            return fam
    fam = family_for_config(config)
    if fam:
        return fam
    nm = str(config.get("network_module", ""))
    if nm.endswith("lora_flux") or any(k in config for k in ("t5xxl", "ae", "clip_l")):
        return FAMILIES["flux"]
    if "blocks_to_swap" in config:
        if weak is not None:
            weak.append("it sets blocks_to_swap, which of the script-less families' keys only FLUX.1's take")
        return FAMILIES["flux"]
    name = str(config.get("pretrained_model_name_or_path", "")).lower()
    if "flux" in name:
        return FAMILIES["flux"]
    if "xl" in name or config.get("sdxl") or "cache_text_encoder_outputs" in config:
        if weak is not None and not config.get("sdxl"):
            weak.append("the model file's name contains 'xl'" if "xl" in name else
                        "it sets cache_text_encoder_outputs, which SD 1.x's train_network.py does not take")
        return FAMILIES["sdxl"]
    if name or nm == "networks.lora":
        if weak is not None:
            weak.append("nothing in it names SDXL or FLUX")
        return FAMILIES["sd15"]
    return None


def coerce(spec: schema.ArgSpec, raw: Any) -> Any:
    """Convert a value that arrived as text (CLI or GUI JSON) to what argparse would make."""
    t = spec.type
    if t == "bool-store_true":
        if isinstance(raw, bool):
            return raw
        return str(raw).strip().lower() in ("1", "true", "yes", "on", "")
    if t == "list":
        items = raw if isinstance(raw, list) else [raw]
        if spec.item_type == "float":
            return [float(x) for x in items]
        return [str(x) for x in items]
    if isinstance(raw, str):
        s = raw.strip()
        if t == "int":
            return int(float(s))
        if t == "float":
            return float(s)
        if t == "int_or_float":
            if s.endswith("%"):
                return float(s[:-1]) / 100
            f = float(s)
            return int(f) if f >= 1 or f == int(f) else f
        return s
    if t == "int" and isinstance(raw, float) and raw.is_integer():
        return int(raw)
    if t == "float" and isinstance(raw, int) and not isinstance(raw, bool):
        return float(raw)
    if t == "int_or_float" and isinstance(raw, float) and raw.is_integer() and raw >= 1:
        return int(raw)
    if t == "str" and not isinstance(raw, str):
        return str(raw)
    return raw


def coerce_checked(name: str, spec: schema.ArgSpec, raw: Any, where: str) -> Any:
    """coerce, with values at the edges (1e400, inf, a 5,000-digit number) refused by key."""
    try:
        value = coerce(spec, raw)
    except OverflowError:
        raise UserError(f"{where}: {name} = {str(raw)[:40]!r} is too large a number.",
                        f"Give {name} an ordinary number.") from None
    safeio.check_values({name: value}, where)
    return value
