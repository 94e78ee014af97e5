"""Our presets exported as kohya_ss GUI files, and the judge of "the same training": shared by
tests/test_gui_export.py, tests/test_kohya_gui_export_oracle.py and benchmarks/gui_files.py.

`differences(ours, gui)` compares two flat sd-scripts configs for one entry script, key by key,
as sd-scripts receives them: a key one side leaves out counts as sd-scripts' default. The only
other differences allowed are in EQUIVALENT, each with the sd-scripts (or LyCORIS) fact that
makes it the same training.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kohya_tuner import gui_export, planning, presets, schema
from kohya_tuner.families import FAMILIES, get_family
from kohya_tuner.planfiles import SAMPLE_PROMPTS_NAME, render

EXPORTED_FAMILIES = [n for n, f in FAMILIES.items() if f.script in gui_export._SCRIPT_BOX]
NOT_EXPORTED = [n for n in FAMILIES if n not in EXPORTED_FAMILIES]
GPUS = (8, 12, 24)
NETWORKS = ("lora", "lycoris:locon", "lycoris:loha", "lycoris:lokr", "lycoris:ia3", "lycoris:dylora",
            "lycoris:glora", "lycoris:diag-oft", "lycoris:boft", "lycoris:full")

EQUIVALENT = {
    "sample_prompts": "the GUI holds the prompts as text and writes them to <output_dir>/sample/prompt.txt; "
                      "the file's text is compared instead of its path",
    "unet_lr": "unset, sd-scripts trains the U-Net at learning_rate (train_network.py passes "
               "args.learning_rate as the default rate), so unet_lr = learning_rate is the same",
    "text_encoder_lr": "unset means learning_rate; a single rate x is [x, x] (networks.lora takes the first of "
                       "a list, multi-encoder networks widen a float to both encoders); ignored when "
                       "network_train_unet_only",
    "max_token_length": "75 is what unset means (library/train_util.py: 75 tokens when max_token_length is None)",
    "t5xxl_dtype": "sd3_train_network.py never reads it (its help says it does not work yet)",
    "optimizer_args": "an empty list is unset (train_util.py: `if args.optimizer_args is not None and len(...) > 0`)",
    "lr_scheduler_args": "an empty list is unset (train_util.py: the same test as optimizer_args)",
    "t5xxl_max_token_length": "unset, flux_train_network.py uses 512 (256 for a schnell model); the GUI always "
                              "writes the number",
    "text_encoder_batch_size": "unset, the text encoders' outputs are cached in batches of train_batch_size "
                               "(train_util.py: caching batch size or the dataset's); the GUI always writes one",
    "gemma2_max_token_length": "unset, Lumina's tokenizer strategy uses 256 (library/strategy_lumina.py); the GUI's "
                               "field cannot be 0",
    "dynamo_backend": "read by sd-scripts only with --torch_compile (train_util.prepare_accelerator)",
    "wandb_run_name": "read only when log_with is wandb",
    "network_args": "LyCORIS' kohya wrapper reads the extra key=value pairs the GUI writes with their defaults "
                    "(conv_dim/conv_alpha = network_dim/network_alpha, preset full, False booleans via str_bool, "
                    "factor -1, block_size 4, dropouts 0); decompose_both='False' reaches LoKr as a true string, "
                    "which only acts when network_dim < factor / 2",
}

# LyCORIS kohya wrapper defaults (lycoris/kohya.py create_network), for the pairs the GUI adds.
_LYCORIS_DEFAULTS = {"preset": "full", "use_tucker": "False", "rank_dropout": "0", "bypass_mode": "False",
                     "dora_wd": "False", "module_dropout": "0", "use_scalar": "False", "rank_dropout_scale": "False",
                     "train_norm": "False", "use_cp": "False", "rescaled": "False", "train_on_input": "False",
                     "factor": "-1", "block_size": "4", "constraint": "0"}

MODEL_FILES = {"pretrained_model_name_or_path": "/models/base.safetensors", "clip_l": "/models/clip_l.safetensors",
               "clip_g": "/models/clip_g.safetensors", "t5xxl": "/models/t5xxl.safetensors",
               "ae": "/models/ae.safetensors"}


# --set lists for the exports that prove the GUI's additional_parameters path and the network
# fields besides the presets: values the LoRA tab drops (0), settings with no field, a warmup
# fraction, dropouts and LoRA+ in network_args, GGPO on FLUX.1.
EXTRA_SETS = {
    "sd15-character-12-extra": ("sd15", "character", 12, "lora", (
        "max_grad_norm=0.0", "seed=0", "zero_terminal_snr=true", "token_warmup_min=2",
        'network_args=["conv_dim=8", "conv_alpha=4", "rank_dropout=0.1", "module_dropout=0.05", '
        '"loraplus_lr_ratio=16"]', 'optimizer_args=["weight_decay=0.01", "betas=0.9,0.99"]')),
    "sdxl-style-12-extra": ("sdxl", "style", 12, "lora", (
        "text_encoder_lr=[5e-05, 2e-05]", "network_train_unet_only=false", "cache_text_encoder_outputs=false",
        "cache_text_encoder_outputs_to_disk=false", "min_snr_gamma=5.0", "xformers=true",
        "sdpa=false", 'lr_scheduler_args=["T_max=100"]')),
    # values the GUI's form refuses (rank above its slider's 512): the field gets 512, the value goes
    # through additional_parameters
    "sd15-style-24-limits": ("sd15", "style", 24, "lora", ("network_dim=600", "network_alpha=300.0")),
    "flux-style-12-extra": ("flux", "style", 12, "lora", (
        'network_args=["img_attn_dim=8", "rank_dropout=0.1", "ggpo_beta=0.01", "ggpo_sigma=0.03"]',
        "guidance_scale=0.0", "loss_type=huber", "huber_c=0.2")),
}


def plan_case(model: str, job: str, gb: int, network: str = "lora", out: Path = Path("/runs/r1"), sets=()):
    """What `kohya-tuner config -m MODEL -j JOB --gpu GB --network NETWORK [--set …] --out OUT`
    composes and writes: (plan, dataset path, prompt text, config.toml text)."""
    family = get_family(model)
    files = {k: v for k, v in MODEL_FILES.items() if k in family.required_files and k != "pretrained_model_name_or_path"}
    inputs, _missing = planning.model_inputs(family, base=MODEL_FILES["pretrained_model_name_or_path"],
                                             clip_l=files.get("clip_l"), t5xxl=files.get("t5xxl"),
                                             ae=files.get("ae"), name="lora", out=out, steps=None,
                                             files={k: v for k, v in files.items() if k not in ("clip_l", "t5xxl", "ae")})
    plan = presets.compose(family.name, job, gb, inputs=inputs, network=None if network == "lora" else network,
                           sets=list(sets))
    dataset = presets.build_dataset(plan, out / "images", None)
    fitted = planning.fit_plan(plan, dataset, gb, use_history=False)
    texts = render(plan, fitted.dataset, out).texts
    return plan, str(out / "dataset.toml"), texts.get(SAMPLE_PROMPTS_NAME), texts["config.toml"]


def cases():
    for model in EXPORTED_FAMILIES:
        for job in presets.JOBS:
            for gb in GPUS:
                yield model, job, gb, "lora"


def _num(v: Any) -> Any:
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return v.lower() if v in ("True", "False", "true", "false") else v
    return v


def _args(items) -> dict[str, Any]:
    return {k: _num(v) for k, _, v in (str(i).partition("=") for i in items or [])}


def network_args_differences(ours: dict, gui: dict) -> list[str]:
    mine, theirs = _args(ours.get("network_args")), _args(gui.get("network_args"))
    out = []
    lyco = ours.get("network_module") == "lycoris.kohya"
    defaults = {k: _num(v) for k, v in _LYCORIS_DEFAULTS.items()} if lyco else {}
    if lyco:
        defaults.update(conv_dim=_num(ours.get("network_dim", 4)), conv_alpha=_num(ours.get("network_alpha", 1)))
    for key in sorted(set(mine) | set(theirs)):
        a, b = mine.get(key, defaults.get(key)), theirs.get(key, defaults.get(key))
        if key == "decompose_both" and lyco and b == "false":
            factor = mine.get("factor", -1.0)
            if factor != -1.0 and float(ours.get("network_dim", 4)) < factor / 2:
                out.append("network_args decompose_both='False' is a true string for LoKr at this rank and factor")
            continue
        if a != b:
            out.append(f"network_args {key}: ours {a!r}, GUI {b!r}")
    return out


def differences(ours: dict[str, Any], gui: dict[str, Any], script: str, *, ours_prompts: str | None = None,
                gui_prompts: str | None = None, schnell: bool = False) -> list[str]:
    """Every way the GUI's config trains otherwise than ours, as sentences (empty: the same)."""
    specs = schema.script_args(script)

    def eff(cfg: dict, key: str) -> Any:
        if key in cfg:
            return cfg[key]
        spec = specs.get(key)
        return spec.default if spec is not None else None

    lr = eff(ours, "learning_rate")
    out: list[str] = []
    for key in sorted(set(ours) | set(gui)):
        a, b = eff(ours, key), eff(gui, key)
        if key == "network_args":
            out += network_args_differences(ours, gui)
            continue
        if key == "sample_prompts":
            if (a is None) != (b is None) and (a is not None or gui_prompts):
                out.append(f"sample_prompts: ours {a!r}, GUI {b!r}")
            elif a is not None and ours_prompts != gui_prompts:
                out.append("sample_prompts: the prompt texts differ")
            continue
        if key == "unet_lr":
            a, b = (lr if a is None else a), (lr if b is None else b)
        if key == "text_encoder_lr":
            if eff(ours, "network_train_unet_only") and eff(gui, "network_train_unet_only"):
                continue
            a, b = (lr if a in (None, []) else a), (lr if b in (None, []) else b)
            a = [a, a] if not isinstance(a, list) else a * 2 if len(a) == 1 else a
            b = [b, b] if not isinstance(b, list) else b * 2 if len(b) == 1 else b
        if key == "max_token_length":
            a, b = (75 if a is None else a), (75 if b is None else b)
        if key in ("optimizer_args", "lr_scheduler_args"):
            a, b = a or None, b or None
        if key == "text_encoder_batch_size":
            a, b = (a or eff(ours, "train_batch_size")), (b or eff(gui, "train_batch_size"))
        if key == "gemma2_max_token_length" and script == "lumina_train_network.py":
            a, b = (a or 256), (b or 256)
        if key == "t5xxl_dtype" and script == "sd3_train_network.py":
            continue
        if key == "t5xxl_max_token_length" and script == "flux_train_network.py":
            a, b = (a or (256 if schnell else 512)), (b or (256 if schnell else 512))
        if key == "dynamo_backend" and not eff(ours, "torch_compile") and not eff(gui, "torch_compile"):
            continue
        if key == "wandb_run_name" and eff(ours, "log_with") != "wandb" and eff(gui, "log_with") != "wandb":
            continue
        if _num(a) != _num(b) and not (isinstance(a, list) and isinstance(b, list)
                                       and [_num(x) for x in a] == [_num(x) for x in b]):
            out.append(f"{key}: ours {a!r}, GUI {b!r}")
    return out


def launch_pairs(options: list[str]) -> dict[str, str]:
    """accelerate options as option -> value (order aside; a flag maps to ''). --dynamo_mode is
    read by accelerate only with a dynamo backend, so it is left out when the backend is no."""
    out: dict[str, str] = {}
    i = 0
    while i < len(options):
        key = options[i]
        if i + 1 < len(options) and not options[i + 1].startswith("--"):
            out[key] = options[i + 1]
            i += 2
        else:
            out[key] = ""
            i += 1
    if out.get("--dynamo_backend", "no").lower() == "no":
        out.pop("--dynamo_mode", None)
    return out


def dumps_case(model, job, gb, network="lora") -> tuple[Any, str, str | None]:
    plan, ds_path, prompts, _toml = plan_case(model, job, gb, network)
    exp = gui_export.for_plan(plan, ds_path, prompts)
    return plan, exp.dumps(), prompts


def load(text: str) -> dict:
    return json.loads(text)


def oracle_cases() -> dict[str, tuple[str, str, int, str, tuple]]:
    """The exports run through the GUI's own code (tools/gui_oracle.py --exports): every exported
    family x job x 8/12/24 GB preset, each LyCORIS algo on SD 1.5, SDXL and FLUX.1, and EXTRA_SETS.
    name -> (model, job, GB, network, --set items)."""
    out = {f"{m}-{j}-{gb}-{n}": (m, j, gb, n, ()) for m, j, gb, n in cases()}
    for model in ("sd15", "sdxl", "flux"):
        for network in NETWORKS[1:]:
            out[f"{model}-character-12-{network.replace(':', '_')}"] = (model, "character", 12, network, ())
    out.update(EXTRA_SETS)
    return out
