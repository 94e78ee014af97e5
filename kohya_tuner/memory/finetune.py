"""Full fine-tunes: the sd-scripts entry scripts that train every weight of a family's model
instead of a LoRA network, and which of its text encoders each one trains.

A full fine-tune is the same family trained by another script, so it is represented as that
family with `script` replaced: schema checks, launchers and the estimator then all see the
script the user runs. Facts of the pinned sd-scripts (48d368fa):

* train_db.py trains the text encoder unless `stop_text_encoder_training` is negative (None
  means until the end);
* fine_tune.py, sdxl_train.py and sd3_train.py train text encoders only with
  `train_text_encoder`; sdxl_train.py and sd3_train.py skip one whose learning rate
  (`learning_rate_te1` / `_te2`, default `learning_rate`) is 0, sd3_train.py trains T5-XXL only
  with `train_t5xxl` too;
* flux_train.py never trains CLIP-L or T5-XXL.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kohya_tuner.families import FAMILIES, Family

# script -> the family it fine-tunes (SD 1.x scripts become SD 2.x with v2 = true).
SCRIPTS = {
    "train_db.py": "sd15",
    "fine_tune.py": "sd15",
    "sdxl_train.py": "sdxl",
    "flux_train.py": "flux",
    "sd3_train.py": "sd3",
}


# Which script implements which fused optimizer step at the pin (each accepts all three flags;
# the others ignore them): fused_backward_pass (Adafactor only, train_util asserts, with
# gradient_accumulation_steps 1) in sdxl_train.py, flux_train.py and sd3_train.py;
# fused_optimizer_groups only in sdxl_train.py (flux_train.py / sd3_train.py: "does not work");
# blockwise_fused_optimizers in flux_train.py and sd3_train.py. train_db.py and fine_tune.py
# have none.
FUSED_BACKWARD_SCRIPTS = frozenset({"sdxl_train.py", "flux_train.py", "sd3_train.py"})
OPTIMIZER_GROUP_SCRIPTS = frozenset({"sdxl_train.py"})
BLOCKWISE_SCRIPTS = frozenset({"flux_train.py", "sd3_train.py"})


def is_finetune(family: Family) -> bool:
    return family.script in SCRIPTS


def family_for(script: str | None, config: dict[str, Any] | None = None, model: str | None = None) -> Family | None:
    """The family `script` fine-tunes, carrying `script` as its entry script; None for a
    script that is not a full fine-tune kohya-tuner estimates."""
    if not script:
        return None
    base = script.replace("\\", "/").rsplit("/", 1)[-1]
    name = SCRIPTS.get(base)
    if name is None:
        return None
    if model:
        # --model picks among the families a script can fine-tune (sd3_train.py: SD3.5 Large).
        from kohya_tuner.families import get_family

        name = get_family(model).name
    elif name == "sd15" and (config or {}).get("v2"):
        name = "sd2"
    return dataclasses.replace(FAMILIES[name], script=base, network_module="")


def _lr(config: dict[str, Any], key: str) -> float:
    v = config.get(key)
    if v is None:
        v = config.get("learning_rate")
    try:
        return float(v) if v is not None else 1e-6
    except (TypeError, ValueError):
        return 1e-6


def te_trained(family: Family, config: dict[str, Any]) -> tuple[bool, ...]:
    names = [t.name for t in family.text_encoders]
    script = family.script
    if script == "train_db.py":
        stop = config.get("stop_text_encoder_training")
        on = stop is None or (isinstance(stop, (int, float)) and not isinstance(stop, bool) and stop >= 0)
        return tuple(on for _ in names)
    if script == "flux_train.py" or not config.get("train_text_encoder"):
        return tuple(False for _ in names)
    if script == "fine_tune.py":
        return tuple(True for _ in names)
    out = []
    for i, name in enumerate(names):
        if name == "t5xxl":
            out.append(bool(config.get("train_t5xxl")) and _lr(config, "learning_rate_te3") != 0)
        else:
            out.append(_lr(config, f"learning_rate_te{i + 1}") != 0)
    return tuple(out)


# ---- memory terms ----------------------------------------------------------------------


def _largest_weight(family_name: str) -> int:
    """The largest single weight of the denoiser (what fused_backward_pass holds a gradient
    for at a time), from the layer shapes in data/lora_targets.json."""
    from kohya_tuner.memory.data import lora_arch

    try:
        arch = lora_arch(family_name)
    except KeyError:
        return 0
    den = arch["components"][arch["denoiser"]]
    rows = list(den.get("targets", [])) + list(den.get("conv_dim_adds", {}).get("targets", []))
    for kind in (den.get("blocks") or {}).values():
        rows += [r[:4] for r in kind.get("per_block", [])]
    best = 0
    for r in rows:
        n_in, n_out, kind = r[0], r[1], r[3]
        best = max(best, n_in * n_out * (9 if kind == "conv3x3" else 1))
    return best


def _blocks(family_name: str) -> int:
    """Blocks blockwise_fused_optimizers steps one at a time (the transformer's block lists)."""
    from kohya_tuner.memory.data import lora_arch

    try:
        arch = lora_arch(family_name)
    except KeyError:
        return 1
    blocks = arch["components"][arch["denoiser"]].get("blocks") or {}
    return max(1, sum(int(b.get("count", 0)) for b in blocks.values()))


def gradient_params(family_name: str, trained: int, *, fused_backward: bool, groups: int) -> tuple[int, str]:
    """Trainable parameters whose gradients are alive at once, and why. fused_backward_pass
    steps the optimizer inside backward and frees each gradient at once (one weight at a
    time); blockwise_fused_optimizers / fused_optimizer_groups step one group at a time."""
    if fused_backward:
        largest = _largest_weight(family_name) or trained // 100
        return min(trained, largest), "fused_backward_pass: one weight's gradient at a time"
    if groups == -1:
        n = _blocks(family_name)
        return -(-trained // n), f"blockwise_fused_optimizers: one of {n} blocks' gradients at a time"
    if groups > 1:
        return -(-trained // groups), f"fused_optimizer_groups {groups}: one group's gradients at a time"
    return trained, "one per trainable weight"


def conv3x3_params(family_name: str) -> int:
    """Weights of the denoiser's 3x3 convolutions. A factored optimizer (Adafactor as
    transformers implements it) factors only the last two dimensions of a weight: for a
    (out, in, 3, 3) kernel its row and column statistics are (out, in, 3) each, two thirds of
    the weight's size, where a Linear's are a row and a column."""
    from kohya_tuner.memory.data import lora_arch

    try:
        arch = lora_arch(family_name)
    except KeyError:
        return 0
    den = arch["components"][arch["denoiser"]]
    rows = den.get("conv_dim_adds", {}).get("targets", [])
    return sum(9 * r[0] * r[1] * r[2] for r in rows if r[3] == "conv3x3")
