"""Evaluate a config against the argument schema, the ranges and the start-up rules."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from kohya_tuner.check import argschema, conditions
from kohya_tuner.check.argschema import not_finite
from kohya_tuner.check.facts import Context, parse_resolution
from kohya_tuner.check.result import CheckResult, Problem
from kohya_tuner.printable import short_repr

_HERE = Path(__file__).resolve().parent
LORA_SCRIPTS = ("train_network.py", "sdxl_train_network.py", "flux_train_network.py", "sd3_train_network.py",
                "lumina_train_network.py", "hunyuan_image_train_network.py", "anima_train_network.py")
SEVERITY = {"problem": "error", "warning": "warning"}


@dataclass(frozen=True)
class Rule:
    id: str
    keys: tuple[str, ...]
    when: Any
    message: str
    where: str
    line: str
    severity: str
    scope: str = "config"
    scripts: tuple[str, ...] = LORA_SCRIPTS
    needs: str | None = None


def _load(name: str) -> dict[str, Any]:
    """A rules file, parsed. tomllib takes tens of milliseconds for rules.toml and json well under
    one, so the package ships each file's parsed form beside it (`<name>.json`, written by
    tools/compile_check_data.py), stamped with the TOML's content hash: a copy that does not match
    the TOML as it is now (someone edited the rules) or does not have the expected shape is not
    used, and the TOML is parsed instead. Nothing is written at run time."""
    import hashlib
    import json

    raw = (_HERE / name).read_bytes()
    try:
        from kohya_tuner import safeio

        compiled = json.loads(safeio.read_regular(_HERE / f"{name}.json", 16 << 20).decode("utf-8"))
        if (isinstance(compiled, dict) and compiled.get("sha256") == hashlib.sha256(raw).hexdigest()
                and isinstance(compiled.get("data"), dict)):
            return compiled["data"]
    except (OSError, ValueError):
        pass
    return parse_toml(raw)


def parse_toml(raw: bytes) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        import tomli as tomllib

    return tomllib.loads(raw.decode("utf-8"))


@lru_cache(maxsize=None)
def _rules_doc() -> dict[str, Any]:
    return _load("rules.toml")


@lru_cache(maxsize=None)
def rules() -> tuple[Rule, ...]:
    out = []
    seen = set()
    for raw in _rules_doc()["rule"]:
        rid = raw["id"]
        if rid in seen:
            raise ValueError(f"rules.toml: duplicate rule id {rid!r}")
        seen.add(rid)
        conditions.validate(raw["when"], rid)
        if raw.get("severity") not in SEVERITY or raw.get("scope", "config") not in ("config", "dataset", "subset"):
            raise ValueError(f"rules.toml: {rid}: bad severity or scope")
        out.append(Rule(id=rid, keys=tuple(raw["keys"]), when=raw["when"], message=raw["message"],
                        where=raw["where"], line=raw["line"], severity=raw["severity"],
                        scope=raw.get("scope", "config"), scripts=tuple(raw.get("scripts", LORA_SCRIPTS)),
                        needs=raw.get("needs")))
    return tuple(out)


@lru_cache(maxsize=None)
def ranges() -> dict[str, dict[str, Any]]:
    return _load("ranges.toml")


def not_lora(script: str | None) -> str | None:
    """What `script` trains when it is not a LoRA script kohya-tuner estimates, else None."""
    if not script:
        return None
    base = script.replace("\\", "/").rsplit("/", 1)[-1]
    return _rules_doc()["not_lora"].get(base)


def _estimated_fine_tune(script: str) -> bool:
    # Imported only for a script that is not LoRA: the memory package is heavy to import.
    from kohya_tuner.memory.finetune import family_for

    return family_for(script) is not None


def not_lora_message(script: str) -> str:
    return (f"{script} is {not_lora(script)} (not LoRA): kohya-tuner checks, estimates and fits LoRA training "
            f"only (train_network.py, sdxl_train_network.py, flux_train_network.py, sd3_train_network.py).")


# ---- message text ---------------------------------------------------------------------

def show(v: Any) -> str:
    if v is None:
        return "unset"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, tuple) and len(v) == 2:
        return f"{v[0]}x{v[1]}"
    return repr(v)


_FIELD = re.compile(r"\{([@\w:.]+)\}")


def _render(message: str, get) -> str:
    return _FIELD.sub(lambda m: show(get(m.group(1))), message)


# ---- ranges -----------------------------------------------------------------------------

def _range_finding(value: Any, bounds: dict[str, Any]) -> tuple[str, str] | None:
    """(severity, why) for a value outside its range: a refusal, or a warning where the table
    says what sd-scripts does instead on that side (`below` / `above`)."""
    why = _range_why(value, bounds)
    if why is None:
        return None
    if argschema.is_number(value) and not not_finite(value):
        lo, hi = bounds.get("min"), bounds.get("max")
        side = "below" if lo is not None and value < lo else "above" if hi is not None and value > hi else None
        if side and bounds.get(side):
            limit = lo if side == "below" else hi
            return "warning", f"{value:g} is {side} {limit:g}: {bounds[side]}"
    return "error", why


def _range_why(value: Any, bounds: dict[str, Any]) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, not {value}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > argschema.INT64_MAX:
        return f"{value} is beyond the 64-bit integers sd-scripts and torch count with"
    if not argschema.is_number(value):
        return None
    lo, hi, gt = bounds.get("min"), bounds.get("max"), bounds.get("gt")
    if gt is not None and not value > gt:
        return f"must be greater than {gt:g}, not {value:g}"
    if lo is not None and value < lo:
        return f"must be at least {lo:g}, not {value:g}" if hi is None else f"must be between {lo:g} and {hi:g}, not {value:g}"
    if hi is not None and value > hi:
        return f"must be at most {hi:g}, not {value:g}" if lo is None else f"must be between {lo:g} and {hi:g}, not {value:g}"
    return None


def _values_of(key: str, value: Any) -> list[Any]:
    """The numbers inside one setting (a resolution string holds two, text_encoder_lr a list)."""
    if key == "resolution":
        res = parse_resolution(value)
        return list(res) if res else []
    if isinstance(value, list):
        return [v for v in value if argschema.is_number(v)]
    return [value] if argschema.is_number(value) else []


def range_problems(config: dict[str, Any], script: str, dataset: dict[str, Any] | None) -> list[Problem]:
    table = ranges()
    specs = argschema.script_args(script)
    out: list[Problem] = []
    for key, value in config.items():
        spec = specs.get(key)
        if spec is None:
            continue
        numeric = spec.type in ("int", "float", "int_or_float") or spec.item_type == "float" or key == "resolution"
        if not numeric:
            continue
        bounds = table.get(key, {})
        for v in _values_of(key, value):
            found = _range_finding(v, bounds)
            if found:
                where = bounds.get("where", f"{spec.source or script} (type {spec.type})")
                out.append(Problem(key, found[1], found[0], (key,), where, f"range.{key}"))
                break
    if isinstance(dataset, dict):
        for path, block in _dataset_blocks(dataset):
            for key, value in block.items():
                bounds = table.get(key)
                if not bounds or not bounds.get("dataset"):
                    continue
                for v in _values_of(key, value) if key != "resolution" else _ds_resolution(value):
                    found = _range_finding(v, bounds)
                    if found:
                        full = f"{path}.{key}" if path else key
                        out.append(Problem(full, found[1], found[0], (full,), bounds["where"], f"range.{key}"))
                        break
    return out


def _ds_resolution(value: Any) -> list[Any]:
    if argschema.is_number(value):
        return [value]
    if isinstance(value, list):
        return [v for v in value if argschema.is_number(v)]
    return []


def _dataset_blocks(dataset: dict[str, Any]):
    general = dataset.get("general")
    if isinstance(general, dict):
        yield "general", general
    for i, ds in enumerate(dataset.get("datasets") or []):
        if not isinstance(ds, dict):
            continue
        yield f"datasets[{i}]", {k: v for k, v in ds.items() if k != "subsets"}
        for j, sub in enumerate(ds.get("subsets") or []):
            if isinstance(sub, dict):
                yield f"datasets[{i}].subsets[{j}]", sub


# ---- the whole check -------------------------------------------------------------------

ORIGINS = ("config_file", "command_line")
# Where each path's values meet argparse, for the messages.
_CONFIG_PATH = "library/train_util.py:read_config_from_file (line 4761: the TOML is parse_args' namespace)"


@lru_cache(maxsize=None)
def outside_choices() -> dict[str, dict[str, Any]]:
    return _load("choices.toml")


def _outside_choices_warning(key: str, value: Any, why: str) -> Problem:
    entry = outside_choices().get(key, {})
    does = (entry.get("values") or {}).get(show(value).strip('"')) or entry.get("any")
    does = does or "kohya-tuner has not traced what the trainer does with it"
    where = entry.get("line") or _CONFIG_PATH
    return Problem(key, f"{why} (argparse's choices, which a --config_file value skips): {does}", "warning",
                   (key,), where, "choices_not_applied")


def key_problems(config: dict[str, Any], script: str, *, unknown_severity: str = "error",
                 origin: str = "config_file") -> list[Problem]:
    """Unknown keys, nested tables, CLI-only keys and wrong types or choices.

    `origin` is the path the values take into sd-scripts. From `--config_file` (the default: what
    kohya-tuner writes and the kohya_ss GUI launches) argparse never sees them, so its `choices`
    are not applied (a value the code then refuses is a rule's business) and a store_true flag is
    tested for truth; a value of the wrong kind still breaks the code that computes with it. From a
    command line argparse has already converted and checked them (the reader reports its refusals)."""
    if origin not in ORIGINS:
        raise ValueError(f"origin must be one of {ORIGINS}, not {origin!r}")
    specs = argschema.script_args(script)
    problems: list[Problem] = []
    for key, value in config.items():
        spec = specs.get(key)
        if spec is None:
            if key in argschema.namespace_schema(script) and key not in _RENAMED_ARGS \
                    and config.get("dataset_class") is None and origin == "config_file":
                problems.append(Problem(key, f"is not an argument of {script}, but sd-scripts hands it to its datasets: "
                                             f"it is the {key} of every dataset and subset that sets none",
                                        "warning", where=_NAMESPACE_WHERE, rule="dataset_default"))
                continue
            if isinstance(value, dict):
                problems.append(Problem(key, "is a nested table; sd-scripts flattens only one level, keep the file "
                                             "one level deep", unknown_severity, where="library/train_util.py:"
                                             "read_config_from_file", rule="nested_table"))
                continue
            near = argschema.closest_key(key, specs)
            hint = f"; did you mean {near!r}?" if near else ""
            problems.append(Problem(key, f"is not an argument of {script} at the pinned sd-scripts commit{hint}",
                                    unknown_severity, where="library/train_util.py:read_config_from_file "
                                    "(unknown keys are ignored silently)", rule="unknown_key"))
            continue
        if spec.cli_only:
            problems.append(Problem(key, "is only meaningful on the command line, not inside --config_file",
                                    unknown_severity, where="library/train_util.py:read_config_from_file",
                                    rule="cli_only"))
            continue
        found = argschema.classify_value(spec, value)
        if not found:
            continue
        kind, why = found
        if origin == "command_line":
            problems.append(Problem(key, why, "error", where=f"{spec.source or script} (argparse type)", rule="type"))
        elif kind == "choices":
            problems.append(_outside_choices_warning(key, value, why))
        elif kind in ("truthy", "fraction", "bool_int"):
            problems.append(Problem(key, why, "warning", where=_CONFIG_PATH, rule=f"config_{kind}"))
        else:
            problems.append(Problem(key, f"{why}: argparse never converts a --config_file value, so the code that "
                                         f"uses {key} gets {short_repr(value)} as written", "error",
                                    where=f"{spec.source or script} ({_CONFIG_PATH})", rule="type"))
    return problems


# Dataset keys that an argparse argument of another name also sets (config_util.py:259:
# train_batch_size -> batch_size, dataset_repeats -> num_repeats): which one wins depends on the order
# of the namespace, so the key alone is no dependable default.
_RENAMED_ARGS = ("batch_size", "num_repeats")
_NAMESPACE_WHERE = "library/config_util.py:BlueprintGenerator.generate (line 410: sanitize_argparse_namespace)"


def namespace_problems(config: dict[str, Any], script: str) -> list[Problem]:
    """The --config_file values sd-scripts' dataset schema refuses when it checks the namespace
    (voluptuous, as strict as for the dataset file), unknown keys included. A store_true flag
    holding 1 or "true" stops the run here, before Python's truthiness could decide."""
    if config.get("dataset_class") is not None:
        return []  # an arbitrary dataset class skips the blueprint and its schema
    schema = argschema.namespace_schema(script)
    out = []
    for key, value in config.items():
        accepts = schema.get(key)
        why = argschema.namespace_type_why(accepts, value) if accepts else None
        if why:
            out.append(Problem(key, f"{why}: sd-scripts checks this setting against its dataset schema before "
                                    f"it builds the datasets and stops (\"expected {accepts[0]}\")", "error",
                               (key,), _NAMESPACE_WHERE, "dataset_namespace"))
    return out


def rule_findings(config: dict[str, Any], script: str, *, dataset: dict[str, Any] | None = None,
                  complete: bool = False, filesystem: bool = False, base_dir: str | Path | None = None,
                  family: str | None = None) -> list[Problem]:
    ctx = Context(config, script, dataset=dataset, filesystem=filesystem, base_dir=base_dir, family_name=family)
    out: list[Problem] = []
    for rule in rules():
        if script not in rule.scripts:
            continue
        if rule.needs == "files" and not filesystem:
            continue
        if rule.needs == "complete" and not complete:
            continue
        for ds, sub in ctx.scopes(rule.scope):
            def get(name, ds=ds, sub=sub):
                return ctx.lookup(name, ds, sub)

            if conditions.holds(rule.when, get):
                out.append(Problem(rule.keys[0], _render(rule.message, get), SEVERITY[rule.severity], rule.keys,
                                   rule.where, rule.id))
                break
    return out


def check(config: dict[str, Any], script: str, *, dataset: dict[str, Any] | None = None, complete: bool = False,
          filesystem: bool = False, base_dir: str | Path | None = None, unknown_keys: str = "warning",
          origin: str = "config_file", parsed: tuple[Problem, ...] | list[Problem] = (),
          family: str | None = None) -> CheckResult:
    """Everything the pinned sd-scripts would refuse (problems) or adjust (warnings) in
    `config` (one flat --config_file dict) and its dataset file, for `script`.

    `origin`: the path the values take (see key_problems); `parsed`: what the reader of a command
    line already found (argparse's own refusals: an unknown flag, a value of the wrong type); `family`:
    the model family when known (rules on the model's own layers need it, e.g. LyCORIS BOFT's widths)."""
    result = CheckResult(script)
    if not_lora(script) and not _estimated_fine_tune(script):
        result.problems.append(Problem("script", not_lora_message(script), "error", ("script",),
                                       f"{script} (not a LoRA script)", "not_lora"))
        return result
    found = list(parsed)
    keyed = key_problems(config, script, unknown_severity=SEVERITY.get(unknown_keys, unknown_keys), origin=origin)
    if origin == "config_file":
        # The schema stops the run first: its finding replaces what the code would have done later.
        namespace = namespace_problems(config, script)
        stopped = {p.key for p in namespace}
        keyed = [p for p in keyed if p.key not in stopped] + namespace
    found += keyed
    found += range_problems(config, script, dataset)
    if isinstance(dataset, dict):
        from kohya_tuner.check.dataset_schema import validate_dataset

        found += validate_dataset(dataset)
    found += rule_findings(config, script, dataset=dataset, complete=complete, filesystem=filesystem,
                           base_dir=base_dir, family=family)
    import dataclasses

    def routed(p: Problem) -> Problem:
        if p.path:
            return p
        in_dataset = p.rule.startswith("dataset") or p.key.startswith(("general", "datasets["))
        return dataclasses.replace(p, path="dataset_config" if in_dataset else origin)

    found = [routed(p) for p in found]
    refused = {p.key for p in found if p.severity == "error"}
    for p in found:
        if p.rule == "choices_not_applied" and p.key in refused:
            continue  # a rule says how the code refuses the value: one finding, not two
        (result.problems if p.severity == "error" else result.warnings).append(p)
    return result
