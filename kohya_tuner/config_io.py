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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import toml

from kohya_tuner import safeio, schema, tomlwrite
from kohya_tuner.errors import UserError
from kohya_tuner.fileio import atomic_write, write_new  # noqa: F401  (the writers live in fileio)
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


# ---- reading -----------------------------------------------------------------------


def _read_text(path: Path) -> str:
    return safeio.read_text(path, "config file")


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


def _guess_family(config: dict[str, Any], script: str | None, model: str | None,
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
    if nm.endswith("lora_flux") or any(k in config for k in ("t5xxl", "ae", "blocks_to_swap", "clip_l")):
        return FAMILIES["flux"]
    name = str(config.get("pretrained_model_name_or_path", "")).lower()
    if "flux" in name:
        return FAMILIES["flux"]
    if "xl" in name or config.get("sdxl") or "cache_text_encoder_outputs" in config:
        if weak is not None and not (config.get("sdxl") or "cache_text_encoder_outputs" in config):
            weak.append("the model file's name contains 'xl'")
        return FAMILIES["sdxl"]
    if name or nm == "networks.lora":
        if weak is not None:
            weak.append("nothing in it names SDXL or FLUX")
        return FAMILIES["sd15"]
    return None


def _coerce(spec: schema.ArgSpec, raw: Any) -> Any:
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


def _coerce_checked(name: str, spec: schema.ArgSpec, raw: Any, where: str) -> Any:
    """_coerce, with values at the edges (1e400, inf, a 5,000-digit number) refused by key."""
    try:
        value = _coerce(spec, raw)
    except OverflowError:
        raise UserError(f"{where}: {name} = {str(raw)[:40]!r} is too large a number.",
                        f"Give {name} an ordinary number.") from None
    safeio.check_values({name: value}, where)
    return value


def _join_wrapped_lines(text: str) -> str:
    """Undo the ways a command line gets split: shell continuations (`\\`, `^`, PowerShell
    backtick) and console wrapping that breaks a token in the middle (a line that starts
    without indentation right after a line that ended without a space)."""
    lines = [ln.rstrip("\r") for ln in text.split("\n")]
    out = ""
    for ln in lines:
        stripped = ln.strip()
        if not stripped or stripped.startswith(("#", "REM ", "rem ", "::")):
            continue
        if not out:
            out = ln.rstrip()
        elif out.endswith(("\\", "^", "`")):
            out = out[:-1].rstrip() + " " + stripped
        elif ln[:1].isspace() or stripped.startswith("--"):
            out += " " + stripped
        else:
            out += stripped
        out = out.rstrip()
    return out


# shlex's splitting (posix, whitespace only, no escape: a backslash is a Windows path
# separator, never an escape) without shlex's cost, which grows with the square of a
# token's length. A quoted part is taken whole; quotes join the parts around them.
_TOKEN_RE = re.compile(r"""(?:[^ \t\r\n'"]|'[^']*'|"[^"]*")+""")
_GAP_RE = re.compile(r"[ \t\r\n]*")
_QUOTED_RE = re.compile(r"'([^']*)'|\"([^\"]*)\"")


def _tokens(command: str) -> list[str]:
    out: list[str] = []
    pos = _GAP_RE.match(command).end()
    while pos < len(command):
        m = _TOKEN_RE.match(command, pos)
        if m is None or (m.end() < len(command) and command[m.end()] not in " \t\r\n"):
            raise UserError("Cannot split the command line: No closing quotation (an unclosed quote?).")
        out.append(_QUOTED_RE.sub(lambda q: q.group(1) if q.group(1) is not None else q.group(2), m.group()))
        pos = _GAP_RE.match(command, m.end()).end()
    return out


def parse_command_line(text: str, model: str | None = None) -> LoadedConfig:
    command = _join_wrapped_lines(text)
    tokens = _tokens(command)
    script_idx = next((i for i, t in enumerate(tokens) if t.replace("\\", "/").endswith(".py")), None)
    if script_idx is None:
        raise UserError("No sd-scripts entry script (…_train_network.py) found in the command line.")
    script_path = tokens[script_idx]
    script_name = script_path.replace("\\", "/").rsplit("/", 1)[-1]
    notes: list[str] = []
    from kohya_tuner.check import not_lora

    from kohya_tuner.memory.finetune import family_for as fine_tune_family

    fine_tune = fine_tune_family(script_name, None, model)
    if not_lora(script_name) and fine_tune is None:
        # Not LoRA training: the check names it; nothing here is parsed as LoRA settings.
        return LoadedConfig({}, None, script_name, "command_line", None, [f"{script_name} is {not_lora(script_name)}"])
    fam = fine_tune or family_for_script(script_name)
    if model and fine_tune is None:
        fam = get_family(model)
    script = fam.script if fam else script_name
    try:
        specs = schema.script_args(script)
    except UserError:
        raise UserError(f"{script_name} is not an sd-scripts LoRA entry script kohya-tuner knows "
                        f"({', '.join(f.script for f in FAMILIES.values())}).") from None
    launcher_opts = tokens[:script_idx]
    if "--mixed_precision" in " ".join(launcher_opts):
        notes.append("accelerate's own --mixed_precision is ignored by sd-scripts; only the script's setting counts")
    config: dict[str, Any] = {}
    dataset_path = None
    args = tokens[script_idx + 1:]
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if not tok.startswith("--"):
            notes.append(f"ignored stray token {tok!r}")
            continue
        name, eq, inline = tok[2:].partition("=")
        values: list[str] = [inline] if eq else []
        if not eq:
            while i < len(args) and not args[i].startswith("--"):
                values.append(args[i])
                i += 1
        spec = specs.get(name)
        if spec is None:
            near = schema.closest_key(name, specs)
            notes.append(f"--{name} is not an argument of {script}" + (f" (did you mean --{near}?)" if near else "")
                         + "; ignored")
            continue
        if name == "config_file":
            notes.append("the command line names a --config_file; read that file for the full picture")
            continue
        if name == "dataset_config":
            dataset_path = values[0] if values else None
            config[name] = dataset_path
            continue
        try:
            if spec.type == "bool-store_true":
                config[name] = True if not values else _coerce_checked(name, spec, values[0], "the command line")
            elif spec.type == "list":
                config[name] = _coerce_checked(name, spec, values, "the command line")
            else:
                if not values:
                    notes.append(f"--{name} has no value; ignored")
                    continue
                config[name] = _coerce_checked(name, spec, values[0], "the command line")
        except ValueError:
            notes.append(f"--{name} {' '.join(values)!r} is not a valid {spec.type}; ignored")
    if fam is None:
        fam = _guess_family(config, script, model)
    if fine_tune is not None:
        fam = fine_tune_family(script_name, config, model)  # train_db.py / fine_tune.py --v2: SD 2.x
    return LoadedConfig(config, fam, script, "command_line", dataset_path, notes)


# kohya_ss GUI keys that are not sd-scripts argument names.
_GUI_RENAMES = {
    "epoch": "max_train_epochs",
    "optimizer": "optimizer_type",
    "max_resolution": "resolution",
    "model_list": None,
    "LoRA_type": None,
    "sdxl": None,
    "flux1_checkbox": None,
}

_GUI_PAIR_RE = re.compile(r'^\s*"([^"]+)"\s*:\s*(.+?)\s*,?\s*$')


def _salvage_json(text: str) -> tuple[dict[str, Any], bool]:
    """Parse JSON; when it is cut short (a truncated paste), keep every complete
    `"key": value` line rather than give up."""
    try:
        data = safeio.parse_guard(json.loads, text, "The JSON file")
        if not isinstance(data, dict):
            raise UserError("The JSON file does not hold an object of settings.")
        safeio.check_values(data, "The JSON file")
        return data, False
    except json.JSONDecodeError:
        pass
    except ValueError as exc:  # an integer beyond Python's digit limit
        raise UserError(f"The JSON file holds a value that cannot be read: {exc}.") from None
    data: dict[str, Any] = {}
    for line in text.splitlines():
        m = _GUI_PAIR_RE.match(line)
        if not m:
            continue
        try:
            data[m.group(1)] = json.loads(m.group(2).rstrip(","))
        except (ValueError, RecursionError):
            continue
    safeio.check_values(data, "The JSON file")
    if not data:
        raise UserError("The file is neither valid JSON nor a recognisable kohya_ss settings file.")
    return data, True


def read_gui_json(text: str, model: str | None = None) -> LoadedConfig:
    data, salvaged = _salvage_json(text)
    notes: list[str] = []
    if salvaged:
        notes.append("the JSON is incomplete (cut short?); read every complete setting line")
    if not any(k in data for k in ("LoRA_type", "network_dim", "network_alpha", "network_module")) and \
            any(k in data for k in ("learning_rate", "train_batch_size", "max_resolution")):
        # The GUI's DreamBooth and fine-tuning tabs save the same form without any network settings.
        script = ("flux_train.py" if data.get("flux1_checkbox") else
                  "sdxl_train.py" if data.get("sdxl") or data.get("sdxl_checkbox") else "train_db.py")
        from kohya_tuner.memory.finetune import family_for as fine_tune_family

        fine_tune = fine_tune_family(script, {"v2": bool(data.get("v2"))}, model)
        if fine_tune is None:
            return LoadedConfig({}, None, script, "kohya_gui_json", None,
                                ["the kohya_ss file has no LoRA settings (LoRA_type, network_dim): a full fine-tune"])
        notes.append(f"the kohya_ss file has no LoRA settings (LoRA_type, network_dim): a full fine-tune ({script})")
        model = None
        data = {**data, "sdxl": False, "flux1_checkbox": False}
    else:
        fine_tune = None
    if fine_tune is not None:
        fam = fine_tune
    elif model:
        fam = get_family(model)
    elif data.get("flux1_checkbox"):
        fam = FAMILIES["flux"]
    elif data.get("sdxl") or data.get("sdxl_checkbox"):
        fam = FAMILIES["sdxl"]
    else:
        fam = None
    script = fam.script if fam else FAMILIES["sd15"].script
    specs = schema.script_args(script)
    config: dict[str, Any] = {}
    extra = data.get("additional_parameters")
    # The GUI keeps LoRA module options as top-level fields; sd-scripts wants them in network_args.
    net_args = []
    for key in ("conv_dim", "conv_alpha"):
        raw = data.get(key)
        if isinstance(raw, (int, float)) and not isinstance(raw, bool) and raw > 0:
            net_args.append(f"{key}={raw:g}")
    if net_args and data.get("conv_dim"):
        config["network_args"] = net_args
    for key, raw in data.items():
        name = _GUI_RENAMES.get(key, key)
        if name is None or key == "additional_parameters":
            continue
        spec = specs.get(name)
        if spec is None or raw is None or raw == "":
            continue
        if name == "resolution" and isinstance(raw, str):
            raw = raw.replace(" ", "")
        if name == "xformers" and isinstance(raw, str):
            # Newer GUIs store the attention choice as a string.
            if raw in ("xformers", "sdpa", "mem_eff_attn"):
                config[raw] = True
            continue
        try:
            value = _coerce_checked(key, spec, raw, "the kohya_ss file")
        except (ValueError, TypeError):
            notes.append(f"{key}={raw!r} is not a valid {spec.type}; ignored")
            continue
        if spec.type == "bool-store_true" and value is False:
            continue
        if spec.type in ("int", "float") and value == 0 and spec.default in (None, 0, 0.0):
            continue  # the GUI writes 0 for "unset"
        config[name] = value
    if isinstance(extra, str) and extra.strip():
        extra_cfg = parse_command_line(f"{script} {extra}", model=fam.name if fam else None)
        config.update(extra_cfg.config)
        notes.extend(extra_cfg.notes)
    if not config and not data.get("LoRA_type"):
        # Any JSON would otherwise pass as an SD 1.5 LoRA with every default: say what it is not.
        shown = ", ".join(list(data)[:5]) or "none"
        raise UserError(f"The JSON holds no kohya_ss or sd-scripts training setting (its keys: {shown}).",
                        "Give a kohya_ss GUI config (.json saved by the GUI), an sd-scripts TOML, or a file holding "
                        "the training command line.")
    assumptions: list[str] = []
    if fam is None:
        weak: list[str] = []
        fam = _guess_family(config, None, None, weak)
        unsaid = ("the kohya_ss file does not say which model it trains (no sdxl / flux1_checkbox field"
                  + ("; the file is cut short" if salvaged else "") + ")")
        if fam is None:
            fam = FAMILIES["sd15"]
            assumptions.append(f"model family SD 1.5: {unsaid}; SD 1.5 is kohya_ss' default. Give --model sdxl "
                               "or --model flux if it trains another model")
        elif weak:
            assumptions.append(f"model family {fam.label}: {unsaid}; guessed because {weak[0]}. Give --model "
                               "to say otherwise")
        script = fam.script
    lora_type = str(data.get("LoRA_type") or "")
    if lora_type and "network_module" not in config and fam is not None and fam.network_module:
        # The GUI passes the network module for its LoRA type itself; the file does not store it.
        config["network_module"] = ("lycoris.kohya" if lora_type.startswith("LyCORIS") else
                                    "networks.dylora" if "DyLoRA" in lora_type else fam.network_module)
    return LoadedConfig(config, fam, script, "kohya_gui_json", config.get("dataset_config"), notes, assumptions)


def read_config(path: str | os.PathLike, model: str | None = None) -> LoadedConfig:
    """Read any of the three forms into one flat sd-scripts config."""
    p = Path(path)
    text = _read_text(p)
    stripped = text.lstrip().lstrip("\ufeff")
    if not stripped:
        raise UserError(f"{p} is empty.")
    if p.suffix.lower() == ".json" or stripped.startswith("{"):
        try:
            return read_gui_json(text.lstrip("\ufeff"), model)
        except UserError as exc:
            raise UserError(f"{p}: {exc.message}", exc.hint) from None
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
    config = flatten(doc)
    nested = [k for k, v in config.items() if isinstance(v, dict)]
    notes = [f"{k} is a nested table; sd-scripts ignores its contents" for k in nested]
    weak: list[str] = []
    from kohya_tuner import assumed as assumed_record

    recorded = assumed_record.parse(text)
    # The family kohya-tuner config planned for, while no model file says it (sd3_train_network.py
    # trains SD3 and both SD3.5 sizes alike).
    planned_model = recorded.pop(assumed_record.MODEL_KEY, None)
    if model is None and planned_model in FAMILIES and not config.get("pretrained_model_name_or_path"):
        model = planned_model
    fam = _guess_family(config, None, model, weak)
    assumptions = [f"model family {fam.label}: the config does not name its script; guessed because {weak[0]}. "
                   "Give --model to say otherwise"] if fam is not None and weak else []
    config, used = assumed_record.merge(config, recorded)
    lines = assumed_record.sentences(used)
    return LoadedConfig(config, fam, fam.script if fam else None, "toml", config.get("dataset_config"), notes,
                        assumptions + lines, used)


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
    if family is not None and not config.get("pretrained_model_name_or_path"):
        guess = _guess_family(config, None, None)  # as read_config will guess it
        if guess is None or guess.name != family.name:
            from kohya_tuner.assumed import MODEL_KEY

            record[MODEL_KEY] = family.name
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
