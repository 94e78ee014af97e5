"""The kohya_ss GUI's form as config_gui reads it: the fields of each tab (kind, fresh-tab value,
recorded from the GUI in kohya_tuner/data/kohya_gui_fields.json), how the GUI updates an older
file as it loads it, what each form component makes of a value, and the pieces every tab's
train_model shares (args splitting, warmup, prompt file, accelerate options, the final filters).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from kohya_tuner.errors import UserError


@lru_cache(maxsize=1)
def _table() -> dict[str, Any]:
    path = Path(__file__).resolve().parent / "data" / "kohya_gui_fields.json"
    return json.loads(path.read_text(encoding="utf-8"))


def _fields() -> dict[str, dict[str, list]]:
    return _table()["tabs"]


def field_limits(tab: str) -> dict[str, dict[str, Any]]:
    """What the tab's form refuses when the button is pressed: numbers outside min/max, dropdown
    values outside choices (recorded from the GUI with the fields)."""
    return _table().get("limits", {}).get(tab, {})


def within(value: Any, limit: dict[str, Any]) -> bool:
    if "choices" in limit:
        return value in limit["choices"]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return True
    return limit.get("min", value) <= value <= limit.get("max", value)


# ---- the form: fresh-tab values, the file's values, each component's round trip ----------

def _component(kind: str, value: Any) -> Any:
    """What a value set into a form component comes back as when the button is pressed."""
    if kind == "bool":
        return bool(value) if value is not None else False
    if kind == "text":
        return "" if value is None else str(value)
    if kind == "int" and isinstance(value, (int, float)) and value is not None:
        return int(round(value))
    return value


def _as_int(value: Any, fallback: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return fallback


def _as_float(value: Any, fallback: float) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return fallback


# The numbers the GUI converts as it loads a file (common_gui.update_my_data), and what it puts in
# place of one it cannot read.
_GUI_INTS = {**{k: 0 for k in ("clip_skip", "epoch", "gradient_accumulation_steps", "keep_tokens", "lr_warmup",
                                "max_data_loader_n_workers", "max_train_epochs", "save_every_n_epochs", "seed",
                                "max_train_steps", "caption_dropout_every_n_epochs")},
             "lr_scheduler_num_cycles": 1, "max_token_length": 75}
_GUI_FLOATS = {**{k: 0.0 for k in ("adaptive_noise_scale", "noise_offset", "learning_rate", "text_encoder_lr",
                                    "unet_lr")}, "lr_scheduler_power": 1.0}


def unreadable_numbers(data: dict[str, Any]) -> list[str]:
    """One line per number the GUI cannot read and silently replaces as it loads the file."""
    out = []
    for table, conv in ((_GUI_INTS, int), (_GUI_FLOATS, float)):
        for key, fallback in table.items():
            value = data.get(key)
            if value is None or isinstance(value, bool):
                continue
            try:
                conv(value)
            except (TypeError, ValueError, OverflowError):
                what = "a whole number" if conv is int else "a number"
                out.append(f"{key} = {value!r}: the GUI cannot read it as {what} and loads it as {fallback}")
    return out


def _upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """The GUI's update of older files as it loads them (common_gui.update_my_data)."""
    d = dict(data)
    d.setdefault("optimizer", "AdamW8bit" if d.get("use_8bit_adam") else "AdamW")
    for key, fallback in _GUI_INTS.items():
        if d.get(key) is not None:
            d[key] = _as_int(d[key], fallback)
    for key, fallback in _GUI_FLOATS.items():
        if d.get(key) is not None:
            d[key] = _as_float(d[key], fallback)
    if d.get("LoRA_type", "Standard") == "LoCon":
        d["LoRA_type"] = "LyCORIS/LoCon"
    if "save_model_as" in d and d.get("LoRA_type") and d["save_model_as"] not in ("safetensors", "ckpt"):
        d["save_model_as"] = "safetensors"
    if isinstance(d.get("xformers"), bool):
        d["xformers"] = "xformers" if d["xformers"] else "none"
    if d.get("use_wandb") == "True":
        d["log_with"] = "wandb"
    d.pop("use_wandb", None)
    if d.get("lora_network_weights") is not None:
        d["network_weights"] = d.pop("lora_network_weights")
    return d


class _Form(dict):
    """The tab's form after loading: attribute access reads a field."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _form(tab: str, data: dict[str, Any]) -> _Form:
    d = _upgrade(data)
    form = _Form()
    for name, (kind, fresh) in _fields()[tab].items():
        raw = d.get(name)
        form[name] = _component(kind, raw if raw is not None else fresh)
    return form


# ---- pieces every tab shares --------------------------------------------------------------

_ARGS_SETTING_RE = re.compile(r"^(\S+=\S+)( \S+=\S+)*$|^$")


def _gui_split(text: Any) -> list[str]:
    """How the GUI turns a text field of `key=value` pairs into a TOML list: double quotes
    dropped, split on whitespace (not shell quoting: a quoted value with a space is split)."""
    return str(text).replace('"', "").split()


def _warmup(lr_warmup: Any, lr_warmup_steps: Any) -> int | float:
    """common_gui.resolve_lr_warmup_steps: steps given win; else the percent as a fraction."""
    pct, steps = _as_float(lr_warmup if lr_warmup != "" else 0, 0.0), _as_float(
        lr_warmup_steps if lr_warmup_steps != "" else 0, 0.0)
    if steps > 0:
        return int(steps)
    return pct / 100 if pct != 0 else 0


def _nz(value: Any) -> Any:
    return value if value != 0 else None


def _prompt_file(f: _Form) -> str | None:
    """create_prompt_file: the GUI writes the prompts to output_dir/sample/prompt.txt and passes
    that path, whatever the prompts are; without an output_dir the GUI refuses to start."""
    out = str(f.output_dir or "").strip()
    if not out:
        return None
    return out + ("" if out.endswith(("/", "\\")) else "/") + "sample/prompt.txt"


def _sample_and_save_keys(f: _Form) -> dict[str, Any]:
    """The sampling, saving and state keys, which every training tab builds the same way."""
    return {
        "sample_every_n_epochs": _nz(f.sample_every_n_epochs),
        "sample_every_n_steps": _nz(f.sample_every_n_steps),
        "sample_prompts": _prompt_file(f),
        "sample_sampler": f.sample_sampler,
        "save_every_n_epochs": _nz(f.save_every_n_epochs),
        "save_every_n_steps": _nz(f.save_every_n_steps),
        "save_last_n_steps": _nz(f.save_last_n_steps),
        "save_last_n_steps_state": _nz(f.save_last_n_steps_state),
        "save_last_n_epochs": _nz(f.save_last_n_epochs),
        "save_last_n_epochs_state": _nz(f.save_last_n_epochs_state),
        "save_model_as": f.save_model_as,
        "save_precision": f.save_precision,
        "save_state": f.save_state,
        "save_state_on_train_end": f.save_state_on_train_end,
        "save_state_to_huggingface": f.save_state_to_huggingface,
        "scale_v_pred_loss_like_noise_pred": f.scale_v_pred_loss_like_noise_pred,
    }


def _shell_quote(token: str) -> str:
    if token and re.fullmatch(r"[\w@%+=:,./-]+", token, flags=re.ASCII):
        return token
    return "'" + token.replace("'", "'\"'\"'") + "'"


def launch_args(f: _Form) -> list[str]:
    """The options the GUI gives `accelerate launch` (class_accelerate_launch.AccelerateLaunch.run_cmd)."""
    out: list[str] = []
    if f.get("dynamo_backend"):
        out += ["--dynamo_backend", str(f.dynamo_backend)]
    if f.get("dynamo_mode"):
        out += ["--dynamo_mode", str(f.dynamo_mode)]
    if f.get("dynamo_use_fullgraph"):
        out.append("--dynamo_use_fullgraph")
    if f.get("dynamo_use_dynamic"):
        out.append("--dynamo_use_dynamic")
    extra = f.get("extra_accelerate_launch_args", "")
    if extra != "":
        out += [_shell_quote(t) for t in _gui_split(extra)]
    if f.get("gpu_ids", "") != "":
        out += ["--gpu_ids", _shell_quote(str(f.gpu_ids))]
    if _as_float(f.get("main_process_port", 0), 0) > 0:
        out += ["--main_process_port", str(int(f.main_process_port))]
    if f.get("mixed_precision"):
        out += ["--mixed_precision", _shell_quote(str(f.mixed_precision))]
    if f.get("multi_gpu"):
        out.append("--multi_gpu")
    for key in ("num_processes", "num_machines", "num_cpu_threads_per_process"):
        if _as_int(f.get(key, 0), 0) > 0:
            out += [f"--{key}", str(int(f[key]))]
    return out


def _tail_args(f: _Form) -> list[str]:
    """additional_parameters, as run_cmd_advanced_training appends them after --config_file."""
    extra = f.get("additional_parameters", "")
    return [_shell_quote(t) for t in _gui_split(extra)] if extra != "" else []


def _check_args_fields(f: _Form) -> None:
    for key in ("lr_scheduler_args", "optimizer_args"):
        value = f.get(key, "")
        if isinstance(value, str) and not _ARGS_SETTING_RE.match(value):
            raise UserError(f"The kohya_ss GUI refuses this file: {key} = {value!r} is not a list of key=value "
                            "pairs with one space between pairs (the GUI's validate_args_setting).",
                            f"Write {key} as key=value key=value, with no spaces inside a pair.")


def _refuse(message: str, hint: str | None = None) -> None:
    raise UserError(f"The kohya_ss GUI refuses this file: {message}", hint)


def _drop_unset_lora(config: dict[str, Any]) -> dict[str, Any]:
    # The LoRA tab leaves out every value equal to "", False or None, and so 0 and 0.0 too.
    return {k: v for k, v in config.items() if not any(v == u for u in ("", False, None))}


def _drop_unset_full(config: dict[str, Any]) -> dict[str, Any]:
    # The DreamBooth and Finetune tabs leave out "", False and None only: 0 stays.
    return {k: v for k, v in config.items() if not (v is None or v is False or (isinstance(v, str) and v == ""))}


