"""Reading a kohya_ss GUI JSON file into the flat config the GUI's own code launches."""

from __future__ import annotations

import json
import re
from typing import Any

from kohya_tuner import safeio, schema
from kohya_tuner.config_cmdline import parse_command_line
from kohya_tuner.config_loaded import LoadedConfig, coerce_checked, guess_family
from kohya_tuner.errors import UserError
from kohya_tuner.families import FAMILIES, get_family


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
    problems: list = []  # the GUI appends additional_parameters to the command line: argparse judges them
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
            value = coerce_checked(key, spec, raw, "the kohya_ss file")
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
        problems.extend(extra_cfg.problems)
    if not config and not data.get("LoRA_type"):
        # Any JSON would otherwise pass as an SD 1.5 LoRA with every default: say what it is not.
        shown = ", ".join(list(data)[:5]) or "none"
        raise UserError(f"The JSON holds no kohya_ss or sd-scripts training setting (its keys: {shown}).",
                        "Give a kohya_ss GUI config (.json saved by the GUI), an sd-scripts TOML, or a file holding "
                        "the training command line.")
    assumptions: list[str] = []
    if fam is None:
        weak: list[str] = []
        fam = guess_family(config, None, None, weak)
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
    return LoadedConfig(config, fam, script, "kohya_gui_json", config.get("dataset_config"), notes, assumptions,
                        problems=problems)
