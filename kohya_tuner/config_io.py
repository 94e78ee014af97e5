"""Reading and writing sd-scripts configs in the forms users keep them.

Inputs: an sd-scripts `--config_file` TOML, a kohya_ss GUI JSON, or a text file holding
an `accelerate launch …` / `python …_train_network.py …` command line. All become one
flat dict of sd-scripts argument names, the form sd-scripts itself ends up with.

Outputs are TOML written by `tomlwrite` (one quoting layer) and proven to read back unchanged through `toml`
0.10.2, the parser sd-scripts uses.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import toml

from kohya_tuner import safeio, schema, tomlwrite
from kohya_tuner.errors import UserError
from kohya_tuner.fileio import atomic_write, write_new  # noqa: F401  (the writers live in fileio)
from kohya_tuner.config_cmdline import parse_command_line  # noqa: F401  (re-exported)
from kohya_tuner.config_gui import read_gui_json  # noqa: F401  (re-exported)
from kohya_tuner.config_loaded import LoadedConfig, guess_family  # noqa: F401  (re-exported)
from kohya_tuner.families import FAMILIES, Family, family_for_config


# ---- reading -----------------------------------------------------------------------


def _read_text(path: Path) -> str:
    return safeio.read_text(path, "config file")


def _is_utf8(path: Path) -> bool:
    try:
        safeio.read_regular(path, safeio.MAX_BYTES).decode("utf-8")
        return True
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return False


def loads_toml(text: str, where: str) -> dict[str, Any]:
    """Parse with the same parser sd-scripts uses, so what we accept it accepts."""
    safeio.check_lines(text, where)
    if text.startswith("\ufeff"):
        # sd-scripts opens the file as plain UTF-8: the mark is then a character toml 0.10.2
        # fails on before a comment or a section, and silently makes part of the first key otherwise.
        raise UserError(f"{where} starts with a UTF-8 byte-order mark (BOM), which sd-scripts' TOML parser "
                        "(toml 0.10.2) cannot read.",
                        "Save it as UTF-8 without BOM (most editors offer that in their encoding menu).")
    try:
        doc = safeio.parse_guard(toml.loads, text, where)
    except toml.TomlDecodeError as exc:
        raise UserError(
            f"{where} is not valid TOML for sd-scripts' parser (toml 0.10.2): {exc.msg} "
            f"at line {exc.lineno}, column {exc.colno}."
        ) from None
    except (IndexError, ValueError, TypeError) as exc:  # toml 0.10.2 raises these on some garbage
        raise UserError(f"{where} is not valid TOML: {exc}.") from None
    safeio.check_values(doc, where)
    return doc


def flatten(doc: dict[str, Any]) -> dict[str, Any]:
    """sd-scripts' flattening: keys of every top-level table are merged into one dict,
    later tables win; top-level scalars are kept as they are."""
    flat: dict[str, Any] = {}
    for key, value in doc.items():
        if isinstance(value, dict):
            flat.update(value)
        else:
            flat[key] = value
    return flat


# The tables of the kohya_ss GUI's own settings file (`config example.toml`, copied to config.toml at the
# GUI's root): defaults for the GUI's form, which the GUI never hands to sd-scripts.
_GUI_SETTINGS_TABLES = frozenset({"settings", "server", "folders", "configuration", "accelerate_launch",
                                  "dataset_preparation", "wd14_caption", "huggingface"})


def _refuse_gui_settings(doc: dict[str, Any], p: Path) -> None:
    found = sorted(_GUI_SETTINGS_TABLES & {k for k, v in doc.items() if isinstance(v, dict)})
    if len(found) >= 3:
        raise UserError(
            f"{p} is the kohya_ss GUI's own settings file (its tables {', '.join(f'[{t}]' for t in found)} hold "
            "defaults for the GUI's form), not a training config: the GUI never gives it to sd-scripts.",
            "Give the config the GUI saves for a training (the .json of its Save button), or the TOML it writes "
            "for sd-scripts beside the output (config_lora-<date>.toml).")


def read_config(path: str | os.PathLike, model: str | None = None) -> LoadedConfig:
    """Read any of the three forms into one flat sd-scripts config."""
    p = Path(path)
    text = _read_text(p)
    stripped = text.lstrip().lstrip("\ufeff")
    if not stripped:
        raise UserError(f"{p} is empty.")
    if p.suffix.lower() == ".json" or stripped.startswith("{"):
        try:
            loaded = read_gui_json(text.lstrip("\ufeff"), model)
        except UserError as exc:
            raise UserError(f"{p}: {exc.message}", exc.hint) from None
        # The GUI opens its files as UTF-8 and hands them to json.load: a byte-order mark or bytes
        # that are no UTF-8 stop it there, before any setting is read.
        if text.startswith("\ufeff"):
            loaded.notes.append("the kohya_ss GUI cannot open this file: it starts with a UTF-8 byte-order mark, "
                                "and the GUI's json.load refuses it ('Unexpected UTF-8 BOM'); save it as UTF-8 "
                                "without BOM for the GUI")
        elif "\ufffd" in text and not _is_utf8(p):
            loaded.notes.append("the kohya_ss GUI cannot open this file: it is not UTF-8 (the GUI reads its "
                                "files as UTF-8), and kohya-tuner read the bytes it could not decode as U+FFFD, "
                                "so a path with such a character differs from the file's")
        return loaded
    suffix = p.suffix.lower()
    if suffix in (".sh", ".bat", ".cmd", ".ps1", ".txt"):
        return parse_command_line(text.lstrip("\ufeff"), model)
    if suffix != ".toml":
        try:
            safeio.parse_guard(toml.loads, text, str(p))
        except Exception:
            if re.search(r"\S+\.py\b", text):
                return parse_command_line(text.lstrip("\ufeff"), model)
    doc = loads_toml(text, str(p))
    _refuse_gui_settings(doc, p)
    config = flatten(doc)
    nested = [k for k, v in config.items() if isinstance(v, dict)]
    notes = [f"{k} is a nested table; sd-scripts ignores its contents" for k in nested]
    weak: list[str] = []
    from kohya_tuner import assumed as assumed_record

    recorded = assumed_record.parse(text)
    # The family kohya-tuner config planned for, while no model file says it (sd3_train_network.py
    # trains SD3 and both SD3.5 sizes alike).
    planned_model = recorded.pop(assumed_record.MODEL_KEY, None)
    planned_script = recorded.pop(assumed_record.SCRIPT_KEY, None)
    if model is None and planned_model in FAMILIES and family_for_config(config, settled_only=True) is None:
        # What kohya-tuner planned the file for outweighs a guess from its keys or a file's name; a
        # network module of one family only still says otherwise.
        model = planned_model
    fam = guess_family(config, None, model, weak)
    planned = _planned_fine_tune(config, planned_script, model)
    fine_tune = None if planned is not None else _fine_tune_reading(config, fam, model)
    if planned is not None:
        notes.append(f"read as a full fine-tune ({planned.script}, {planned.label}): the entry script kohya-tuner "
                     f"recorded when it wrote this file")
        fam, weak = planned, []
    elif fine_tune is not None:
        notes.append(f"no network settings and {fine_tune[1]}, which only {fine_tune[0].script} takes: read as a "
                     f"full fine-tune ({fine_tune[0].script}, {fine_tune[0].label})")
        fam, weak = fine_tune[0], []
    assumptions = [f"model family {fam.label}: the config does not name its script; guessed because {weak[0]}. "
                   "Give --model to say otherwise"] if fam is not None and weak else []
    config, used = assumed_record.merge(config, recorded)
    lines = assumed_record.sentences(used)
    return LoadedConfig(config, fam, fam.script if fam else None, "toml", config.get("dataset_config"), notes,
                        assumptions + lines, used)


# The LoRA entry script each full fine-tune script stands beside: a key the fine-tune script
# takes and its LoRA script does not is what gives a fine-tune TOML away.
_FINE_TUNE_SCRIPTS = {"sdxl_train.py": "sdxl_train_network.py", "train_db.py": "train_network.py",
                      "fine_tune.py": "train_network.py", "flux_train.py": "flux_train_network.py",
                      "sd3_train.py": "sd3_train_network.py"}


def _planned_fine_tune(config: dict[str, Any], script: Any, model: str | None) -> Family | None:
    """The fine-tune family of the entry script a written plan recorded, or None. A network_* key
    the user added since says the file now trains a network, whatever the record says."""
    if not isinstance(script, str) or any(k.startswith("network_") for k in config):
        return None
    from kohya_tuner.memory.finetune import family_for

    return family_for(script, config, model)


def recorded_script(config: dict[str, Any], family: Family) -> str | None:
    """The entry script to record in a written config: `family.script` when a reader of the file
    would not find it from the keys alone (a full fine-tune TOML with no fine-tune-only key)."""
    if family.script not in _FINE_TUNE_SCRIPTS:
        return None
    reading = _fine_tune_reading(config, guess_family(config, None, None), None)
    return None if reading is not None and reading[0].script == family.script else family.script


def _fine_tune_reading(config: dict[str, Any], fam: Family | None, model: str | None
                       ) -> tuple[Family, str] | None:
    """(the fine-tune family, the keys that say so) for a TOML that sets no network_* key and sets
    keys only a full fine-tune script takes (sdxl_train.py's learning_rate_te1, train_db.py's
    stop_text_encoder_training…); None for everything else. A TOML names no script, so its
    keys are the evidence; the most specific script wins, then the one of the guessed family."""
    if any(k.startswith("network_") for k in config):
        return None
    from kohya_tuner.memory.finetune import family_for

    best: tuple[int, bool, str, list[str]] | None = None
    for ft, lora in _FINE_TUNE_SCRIPTS.items():
        only = sorted(set(config) & (set(schema.script_args(ft)) - set(schema.script_args(lora))))
        if not only:
            continue
        ft_family = family_for(ft, config, model)
        same = fam is not None and ft_family is not None and ft_family.name == fam.name
        rank = (len(only), same, ft, only)
        if best is None or rank[:2] > best[:2]:
            best = rank
    if best is None:
        return None
    found = family_for(best[2], config, model)
    return (found, ", ".join(best[3])) if found is not None else None


def read_dataset(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    text = safeio.read_text(p, "dataset file")
    if p.suffix.lower() == ".json":
        try:
            data = safeio.parse_guard(json.loads, text.lstrip("\ufeff"), str(p))
        except json.JSONDecodeError as exc:
            raise UserError(f"{p} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}.") from None
        except ValueError as exc:
            raise UserError(f"{p} holds a value that cannot be read: {exc}.") from None
        safeio.check_values(data, str(p))
    else:
        data = loads_toml(text, str(p))
    if not isinstance(data, dict):
        raise UserError(f"{p} does not hold a dataset config table.")
    safeio.check_dataset_shape(data, str(p))
    return data


def effective_settings(config: dict[str, Any], dataset: dict[str, Any] | None = None) -> dict[str, Any]:
    """The values sd-scripts will train with after the dataset file's precedence rules
    (subset > dataset > general > training argument > default), for the memory-relevant
    keys. With several datasets, the most demanding one (largest batch × area) wins."""

    def res_pair(v: Any) -> tuple[int, int] | None:
        if v is None:
            return None
        if isinstance(v, (list, tuple)) and len(v) == 2:
            return int(v[0]), int(v[1])
        if isinstance(v, (int, float)):
            return int(v), int(v)
        parts = [x for x in str(v).replace(" ", "").split(",") if x]
        try:
            nums = [int(float(x)) for x in parts]
        except ValueError:
            return None
        if len(nums) == 1:
            return nums[0], nums[0]
        if len(nums) >= 2:
            return nums[0], nums[1]
        return None

    base = {
        "batch_size": config.get("train_batch_size", 1),
        "resolution": res_pair(config.get("resolution")),
        "enable_bucket": bool(config.get("enable_bucket", False)),
        "max_bucket_reso": config.get("max_bucket_reso", 1024),
        "min_bucket_reso": config.get("min_bucket_reso", 256),
        "bucket_reso_steps": config.get("bucket_reso_steps", 64),
        "bucket_no_upscale": bool(config.get("bucket_no_upscale", False)),
        "num_repeats": config.get("dataset_repeats", 1),
        "shuffle_caption": bool(config.get("shuffle_caption", False)),
        "caption_dropout_rate": config.get("caption_dropout_rate", 0.0),
    }
    if not dataset:
        return base
    general = dataset.get("general") or {}
    candidates = []
    for ds in dataset.get("datasets") or [{}]:
        eff = dict(base)
        for level in (general, ds):
            for k in eff:
                if k in level and level[k] is not None:
                    eff[k] = res_pair(level[k]) if k == "resolution" else level[k]
        subs = ds.get("subsets") or []
        if subs:
            for k in ("shuffle_caption", "num_repeats"):
                vals = [s[k] for s in subs if k in s]
                if vals:
                    eff[k] = any(vals) if k == "shuffle_caption" else max(vals)
        candidates.append(eff)

    def demand(e):
        r = e["resolution"] or (0, 0)
        return (e["batch_size"] or 1) * r[0] * r[1]

    return max(candidates, key=demand)


def show_value(value: Any) -> str:
    """A setting as people read it in tables and reports: `unset`, `[a, b]`, or the value."""
    if value is None:
        return "unset"
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


# ---- writing -----------------------------------------------------------------------

def _comment(text: str) -> str:
    return "".join(f"# {line}\n" for line in text.strip().splitlines())


def dumps_config(config: dict[str, Any], why: dict[str, str] | None = None, *, script: str | None = None,
                 header: str | None = None, assumed: dict[str, Any] | None = None,
                 family: Family | None = None) -> str:
    """A `--config_file` TOML: one level of sections (ignored by sd-scripts), each key
    preceded by the reason it has this value when `why` gives one."""
    sources: dict[str, str] = {}
    if script:
        raw = schema.raw_schema()["scripts"].get(script, {}).get("args", [])
        sources = {a["name"]: a.get("source", "") for a in raw}
    groups: dict[str, list[str]] = {}
    for key in sorted(config):
        value = config[key]
        if value is None:
            continue
        groups.setdefault(tomlwrite.section_of(key, sources), []).append(key)
    out = []
    if header:
        out.append(_comment(header))
    record = {k: v for k, v in (assumed or {}).items() if config.get(k) is None}
    if family is not None:
        # Recorded, so the file keeps meaning the model it was planned for through an ordinary edit
        # (a LyCORIS module, the caching keys taken out, a block swap added, a generic model name).
        from kohya_tuner.assumed import MODEL_KEY

        record[MODEL_KEY] = family.name
    if family is not None and (planned := recorded_script(config, family)):
        from kohya_tuner.assumed import SCRIPT_KEY

        record[SCRIPT_KEY] = planned
    if record:
        from kohya_tuner.assumed import comment_block

        out.append(comment_block(record))
    for section in tomlwrite.SECTION_ORDER:
        keys = groups.get(section)
        if not keys:
            continue
        out.append(f"[{section}]\n")
        for key in keys:
            if why and why.get(key):
                out.append(_comment(why[key]))
            out.append(tomlwrite.dumps_pair(key, config[key]))
        out.append("\n")
    text = "".join(out).rstrip() + "\n"
    check_roundtrip(text, config)
    return text


def dumps_dataset(dataset: dict[str, Any], header: str | None = None) -> str:
    text = (_comment(header) + "\n" if header else "") + tomlwrite.dumps(dataset)
    tomlwrite.verify(text, dataset, "dataset TOML")
    return text


def check_roundtrip(text: str, config: dict[str, Any]) -> None:
    """The written file must mean exactly `config` to sd-scripts: parse it with toml
    0.10.2 and flatten as sd-scripts does."""
    tomlwrite.verify(text, config, "config TOML", flat=flatten)
