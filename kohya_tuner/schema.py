"""The sd-scripts argument schema at the pinned commit, and validation against it.

sd-scripts reads `--config_file` with no type conversion, no choices check and no
unknown-key check, and a wrong value fails hours later or silently misbehaves. So
every config kohya-tuner writes or reads goes through `validate_config`, and every
dataset file through `validate_dataset`. The schema is `vendor/sd-scripts/args.json`.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr
from pydantic import ValidationError, create_model

from kohya_tuner.errors import UserError
from kohya_tuner.families import FAMILIES, Family
from kohya_tuner.resources import vendor_file


class ArgSpec(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    type: str
    default: Any = None
    choices: Optional[list[Any]] = None
    nargs: Optional[str] = None
    toml: str = ""
    item_type: Optional[str] = None
    cli_only: bool = False
    secret: bool = False
    desc: str = ""

    @property
    def is_flag(self) -> bool:
        return self.type == "bool-store_true"


@dataclass(frozen=True)
class Problem:
    key: str
    message: str
    severity: Literal["error", "warning"] = "error"

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


@lru_cache(maxsize=None)
def raw_schema() -> dict[str, Any]:
    with open(vendor_file("sd-scripts", "args.json"), encoding="utf-8") as fh:
        return json.load(fh)


@lru_cache(maxsize=None)
def script_args(script: str) -> dict[str, ArgSpec]:
    scripts = raw_schema()["scripts"]
    if script not in scripts:
        raise UserError(f"sd-scripts has no entry script {script!r} at the pinned commit.")
    return {a["name"]: ArgSpec.model_validate(a) for a in scripts[script]["args"]}


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


_RES_RE = re.compile(r"^\s*\d+\s*(,\s*\d+\s*)?$")


def _check_value(spec: ArgSpec, value: Any) -> str | None:
    """Why `value` is not what the script would see after CLI parsing, or None."""
    t = spec.type
    if t == "bool-store_true":
        if not isinstance(value, bool):
            return f"must be true or false, not {value!r}"
    elif t == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be an integer, not {value!r}"
    elif t == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"must be a number, not {value!r}"
    elif t == "int_or_float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"must be an integer step count or a fraction below 1, not {value!r}"
        if isinstance(value, float) and value >= 1:
            return (f"{value!r} is a float, which sd-scripts reads as a fraction of all steps "
                    f"({value:g} x the total); write an integer ({int(value)}) for a step count")
    elif t == "str":
        if not isinstance(value, str):
            if spec.name in ("resolution", "face_crop_aug_range"):
                return (f"must be written as a string in --config_file (e.g. \"1024\" or \"1024,768\"), "
                        f"not {value!r}; sd-scripts crashes on a number or array here")
            return f"must be a string, not {value!r}"
        if spec.name == "resolution" and not _RES_RE.match(value):
            return f"must look like \"1024\" or \"1024,768\", not {value!r}"
    elif t == "list":
        if spec.name == "text_encoder_lr" and isinstance(value, (int, float)) and not isinstance(value, bool):
            return None
        if not isinstance(value, list):
            return f"must be an array, not {value!r}"
        kinds = {type(v) for v in value}
        if len(kinds) > 1 and kinds != {int, float}:
            return "must hold values of one type (the toml 0.10.2 parser sd-scripts uses rejects mixed arrays)"
        if len(kinds) > 1:
            return "mixes integers and floats; toml 0.10.2 rejects such arrays, write every item with a decimal point"
        item = spec.item_type or "str"
        for v in value:
            if item == "str" and not isinstance(v, str):
                return f"items must be strings like \"key=value\", not {v!r}"
            if item == "float" and (isinstance(v, bool) or not isinstance(v, (int, float))):
                return f"items must be numbers, not {v!r}"
    if spec.choices and value not in spec.choices:
        allowed = ", ".join(repr(c) for c in spec.choices if c is not None)
        return f"{value!r} is not one of {allowed}"
    return None


def _int_or_none(v: Any) -> int | None:
    """The integer a constraint compares, or None for a value the type check already reports."""
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def network_args_dict(config: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    raw = config.get("network_args")
    # A non-array value is reported by validate_config; here it simply holds no arguments.
    for item in raw if isinstance(raw, (list, tuple)) else []:
        if isinstance(item, str) and "=" in item:
            k, v = item.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def _dataset_values(dataset: dict[str, Any] | None, key: str) -> list[Any]:
    """Every value of `key` at any level of a dataset config."""
    if not dataset:
        return []
    found = []
    general = dataset.get("general") or {}
    if key in general:
        found.append(general[key])
    for ds in dataset.get("datasets") or []:
        if key in ds:
            found.append(ds[key])
        for sub in ds.get("subsets") or []:
            if key in sub:
                found.append(sub[key])
    return found


def _any_true(config, dataset, key) -> bool:
    return bool(config.get(key)) or any(bool(v) for v in _dataset_values(dataset, key))


def _constraint_problems(config: dict[str, Any], family: Family | None,
                         dataset: dict[str, Any] | None) -> list[Problem]:
    p: list[Problem] = []
    mp = config.get("mixed_precision", "no")
    if config.get("full_fp16") and mp != "fp16":
        p.append(Problem("full_fp16", "needs mixed_precision = \"fp16\""))
    if config.get("full_bf16") and mp != "bf16":
        p.append(Problem("full_bf16", "needs mixed_precision = \"bf16\""))
    for key in ("fp8_base", "fp8_base_unet"):
        if config.get(key) and mp == "no":
            p.append(Problem(key, "needs mixed_precision \"bf16\" or \"fp16\" (sd-scripts asserts)"))
    if config.get("fused_backward_pass"):
        if str(config.get("optimizer_type", "")).lower() != "adafactor":
            p.append(Problem("fused_backward_pass", "needs optimizer_type = \"Adafactor\""))
        if _int_or_none(config.get("gradient_accumulation_steps", 1) or 1) != 1:
            p.append(Problem("fused_backward_pass", "needs gradient_accumulation_steps = 1"))
    if (config.get("use_8bit_adam") or config.get("use_lion_optimizer")) and config.get("optimizer_type"):
        p.append(Problem("optimizer_type", "cannot be combined with use_8bit_adam / use_lion_optimizer"))
    if _any_true(config, dataset, "color_aug") or _any_true(config, dataset, "random_crop"):
        if config.get("cache_latents") or config.get("cache_latents_to_disk"):
            p.append(Problem("cache_latents", "sd-scripts refuses latent caching with color_aug or random_crop"))
    swap = config.get("blocks_to_swap")
    if swap:
        if family is not None and family.blocks_to_swap_max is None:
            p.append(Problem("blocks_to_swap", f"{family.label} has no block swap"))
        elif family is not None and _int_or_none(swap) is not None and not family.blocks_to_swap_ok(int(swap)):
            p.append(Problem("blocks_to_swap", f"must be 1..{family.blocks_to_swap_max} for {family.label}, not {swap}"))
        if config.get("cpu_offload_checkpointing"):
            p.append(Problem("cpu_offload_checkpointing", "cannot be combined with blocks_to_swap (sd-scripts asserts)"))
    if config.get("cpu_offload_checkpointing") and family is not None and family.name != "flux":
        if config.get("gradient_checkpointing"):
            p.append(Problem("cpu_offload_checkpointing",
                             f"only FLUX implements it; with {family.label} and gradient_checkpointing sd-scripts raises TypeError"))
    if config.get("split_mode"):
        p.append(Problem("split_mode", "is deprecated; use blocks_to_swap (split_mode alone means blocks_to_swap = 18)",
                         "warning"))
    if family is not None:
        steps = [config.get("bucket_reso_steps")] + _dataset_values(dataset, "bucket_reso_steps")
        for s in steps:
            if isinstance(s, int) and not isinstance(s, bool) and s % family.bucket_step:
                p.append(Problem("bucket_reso_steps", f"must be a multiple of {family.bucket_step} for {family.label}, not {s}"))
        if family.name == "sdxl" and config.get("v2"):
            p.append(Problem("v2", "must be false for SDXL"))
    te_cache = config.get("cache_text_encoder_outputs") or config.get("cache_text_encoder_outputs_to_disk")
    if te_cache:
        for key in ("shuffle_caption",):
            if _any_true(config, dataset, key):
                p.append(Problem("cache_text_encoder_outputs",
                                 f"sd-scripts refuses text-encoder caching together with {key}"))
        for key in ("caption_dropout_rate", "caption_tag_dropout_rate", "token_warmup_step"):
            vals = [config.get(key)] + _dataset_values(dataset, key)
            if any(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in vals):
                p.append(Problem("cache_text_encoder_outputs",
                                 f"sd-scripts refuses text-encoder caching together with {key} > 0"))
        if family is not None and family.name == "sdxl" and not config.get("network_train_unet_only"):
            p.append(Problem("cache_text_encoder_outputs", "needs network_train_unet_only = true for SDXL (sd-scripts asserts)"))
        if network_args_dict(config).get("train_t5xxl") == "True":
            p.append(Problem("cache_text_encoder_outputs", "cannot be used with network_args train_t5xxl=True"))
    if family is not None and config.get("network_module") not in (None, family.network_module):
        nm = config.get("network_module")
        if not (family.name == "flux" and nm == "networks.oft_flux"):
            p.append(Problem("network_module", f"{family.label} trains LoRA with {family.network_module!r}, not {nm!r}"))
    return p


def validate_config(config: dict[str, Any], script: str, *, dataset: dict[str, Any] | None = None,
                    family: Family | None = None) -> list[Problem]:
    """Every problem with a flat `--config_file` dict for `script` (errors and warnings)."""
    specs = script_args(script)
    if family is None:
        family = next((f for f in FAMILIES.values() if f.script == script), None)
    problems: list[Problem] = []
    for key, value in config.items():
        spec = specs.get(key)
        if spec is None:
            if isinstance(value, dict):
                problems.append(Problem(key, "is a nested table; sd-scripts flattens only one level, keep the file one level deep"))
                continue
            near = closest_key(key, specs)
            hint = f"; did you mean {near!r}?" if near else ""
            problems.append(Problem(key, f"is not an argument of {script} at the pinned sd-scripts commit{hint}"))
            continue
        if spec.cli_only:
            problems.append(Problem(key, "is only meaningful on the command line, not inside --config_file"))
            continue
        why = _check_value(spec, value)
        if why:
            problems.append(Problem(key, why))
    problems.extend(_constraint_problems(config, family, dataset))
    return problems


def errors_only(problems: list[Problem]) -> list[Problem]:
    return [p for p in problems if p.severity == "error"]


def raise_if_invalid(problems: list[Problem], what: str) -> None:
    errs = errors_only(problems)
    if errs:
        listed = "; ".join(str(p) for p in errs)
        raise UserError(f"{what} is not valid for sd-scripts: {listed}.")


# ---- dataset config -------------------------------------------------------------

def _float_literal(v: Any) -> Any:
    # sd-scripts' voluptuous schema rejects `0` where it wants `0.0`; pydantic would coerce.
    if isinstance(v, int):
        raise ValueError("needs a float literal with a decimal point (write 0.0, not 0)")
    return v


_TomlFloat = Annotated[StrictFloat, BeforeValidator(_float_literal)]

_ACCEPT_TYPES: dict[str, Any] = {
    "str": StrictStr,
    "bool": StrictBool,
    "int": StrictInt,
    "float": _TomlFloat,
    "table": dict[str, Any],
    "array[int,int]": Annotated[list[StrictInt], Field(min_length=2, max_length=2)],
    "array[float,float]": Annotated[list[_TomlFloat], Field(min_length=2, max_length=2)],
}


def _field_type(accepts: list[str]):
    types = [_ACCEPT_TYPES[a] for a in accepts]
    return types[0] if len(types) == 1 else Union[tuple(types)]  # type: ignore[return-value]


@lru_cache(maxsize=None)
def _dataset_models():
    keys = raw_schema()["dataset_config"]["keys"]
    strict = ConfigDict(extra="forbid", strict=True)

    def fields(level: str) -> dict[str, Any]:
        return {k: (Optional[_field_type(v["accepts"])], None) for k, v in keys.items() if level in v["levels"]}

    subset = create_model("Subset", __config__=strict, **fields("subsets"))
    dataset = create_model("Dataset", __config__=strict, subsets=(list[subset], ...), **fields("datasets"))
    general = create_model("General", __config__=strict, **fields("general"))
    top = create_model("DatasetConfig", __config__=strict, general=(Optional[general], None),
                       datasets=(list[dataset], ...))
    return top


def _loc(loc: tuple) -> str:
    """A readable path like datasets[0].subsets[1].num_repeats; pydantic's union and
    type tags inside `loc` are dropped because they are not keys the user wrote."""
    names = set(raw_schema()["dataset_config"]["keys"]) | {"general", "datasets", "subsets"}
    out = ""
    last_was_key = False
    for part in loc:
        if isinstance(part, int):
            if last_was_key and out.endswith(("datasets", "subsets")):
                out += f"[{part}]"
            continue
        if part in names or not last_was_key:
            out += ("." if out else "") + str(part)
            last_was_key = True
        else:
            break
    return out or "(top level)"


def validate_dataset(dataset: dict[str, Any], family: Family | None = None) -> list[Problem]:
    """Problems with a `--dataset_config` dict, as strict as sd-scripts' own validator."""
    problems: list[Problem] = []
    try:
        _dataset_models().model_validate(dataset)
    except ValidationError as exc:
        seen = set()
        for err in exc.errors():
            where = _loc(err["loc"])
            if where in seen:
                continue
            seen.add(where)
            if err["type"] == "extra_forbidden":
                key = str(err["loc"][-1])
                where = f"{where}.{key}" if where != "(top level)" and not where.endswith(key) else key
                known = raw_schema()["dataset_config"]["keys"]
                near = closest_key(key, known)
                hint = f"; did you mean {near!r}?" if near else ""
                problems.append(Problem(where, f"is not allowed here (sd-scripts' dataset schema is strict){hint}"))
            elif err["type"] == "missing":
                problems.append(Problem(where, "is required"))
            else:
                problems.append(Problem(where, f"{err['msg'].lower()} (got {err.get('input')!r})"))
    for i, ds in enumerate(dataset.get("datasets") or []):
        if not isinstance(ds, dict):
            continue
        subs = [s for s in ds.get("subsets") or [] if isinstance(s, dict)]
        with_meta = [s for s in subs if "metadata_file" in s]
        if with_meta and len(with_meta) != len(subs):
            problems.append(Problem(f"datasets[{i}]", "mixes DreamBooth subsets and fine-tuning subsets (metadata_file)"))
        for j, s in enumerate(subs):
            if "metadata_file" not in s and "image_dir" not in s:
                problems.append(Problem(f"datasets[{i}].subsets[{j}]", "needs image_dir"))
    if family is not None:
        for v in _dataset_values(dataset, "bucket_reso_steps"):
            if isinstance(v, int) and v % family.bucket_step:
                problems.append(Problem("bucket_reso_steps", f"must be a multiple of {family.bucket_step} for {family.label}"))
    return problems
