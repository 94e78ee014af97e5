"""A plan's flat sd-scripts config as a kohya_ss GUI file: the LoRA tab's JSON that the GUI loads
and turns back into the same training.

This is the inverse of kohya_tuner.config_gui (which reads GUI files the way the GUI's own code
launches them, docs/kohya-gui.md): each setting goes into the form field whose value the GUI's
train_model makes into that sd-scripts key. The GUI's form has a field for most settings; the
ones it cannot express go into its `additional_parameters` field, which the GUI appends after
`--config_file` (so argparse reads them and they win over the TOML). A setting that neither can
carry (a value holding a space or a double quote, which the GUI splits or drops) is refused by
name: nothing is dropped in silence. The dataset goes through the GUI's `dataset_config` field
(our dataset.toml), so the GUI neither needs a kohya folder layout nor counts images for steps.

Every field of the LoRA tab is written (a file missing a field would get what the user's GUI
form holds at the time), from the fresh-tab values recorded from the GUI
(kohya_tuner/data/kohya_gui_fields.json). Pure: no file is read or written here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from kohya_tuner import schema
from kohya_tuner.config_gui_form import _fields, field_limits, within
from kohya_tuner.errors import UserError

# Entry script -> the GUI's model checkbox (LoRA tab) that makes train_model launch it.
_SCRIPT_BOX = {
    "train_network.py": None,
    "sdxl_train_network.py": "sdxl",
    "flux_train_network.py": "flux1_checkbox",
    "sd3_train_network.py": "sd3_checkbox",
    "hunyuan_image_train_network.py": "hunyuan_image_checkbox",
    "anima_train_network.py": "anima_checkbox",
    "lumina_train_network.py": "lumina_checkbox",
}
# The LoRA_type each newer model checkbox launches with, and its module.
_DIT_TYPES = {"hunyuan_image_checkbox": ("HunyuanImage-2.1", "networks.lora_hunyuan_image"),
              "anima_checkbox": ("Anima", "networks.lora_anima"),
              "lumina_checkbox": ("Lumina", "networks.lora_lumina")}

# sd-scripts key -> LoRA-tab field, where the tab writes the field's value under another key
# (or only with a family's checkbox set). Keys not listed here and not handled below go to a
# field of the same name when the tab has one that train_model writes as that key.
_RENAMED = {
    "resolution": "max_resolution",
    "optimizer_type": "optimizer",
}
_FAMILY_RENAMED = {
    "sdxl": {"no_half_vae": "sdxl_no_half_vae", "cache_text_encoder_outputs": "sdxl_cache_text_encoder_outputs"},
    "flux1_checkbox": {"cache_text_encoder_outputs": "flux1_cache_text_encoder_outputs",
                       "cache_text_encoder_outputs_to_disk": "flux1_cache_text_encoder_outputs_to_disk"},
    "sd3_checkbox": {"cache_text_encoder_outputs": "sd3_cache_text_encoder_outputs",
                     "cache_text_encoder_outputs_to_disk": "sd3_cache_text_encoder_outputs_to_disk",
                     "clip_l": "sd3_clip_l", "t5xxl": "sd3_t5xxl",
                     "clip_l_dropout_rate": "sd3_clip_l_dropout_rate", "t5_dropout_rate": "sd3_t5_dropout_rate",
                     "disable_mmap_load_safetensors": "sd3_disable_mmap_load_safetensors",
                     "enable_scaled_pos_embed": "sd3_enable_scaled_pos_embed",
                     "fused_backward_pass": "sd3_fused_backward_pass",
                     "text_encoder_batch_size": "sd3_text_encoder_batch_size"},
    "hunyuan_image_checkbox": {
        **{k: f"hunyuan_{k}" for k in ("vae", "text_encoder", "byt5", "discrete_flow_shift", "model_prediction_type",
                                       "timestep_sampling", "sigmoid_scale", "attn_mode", "split_attn", "fp8_scaled",
                                       "fp8_vl", "text_encoder_cpu", "vae_chunk_size")},
        "cache_text_encoder_outputs": "hunyuan_image_cache_text_encoder_outputs",
        "cache_text_encoder_outputs_to_disk": "hunyuan_image_cache_text_encoder_outputs_to_disk"},
    "anima_checkbox": {
        k: f"anima_{k}" for k in ("vae", "discrete_flow_shift", "timestep_sampling", "sigmoid_scale", "attn_mode",
                                  "split_attn", "vae_chunk_size", "qwen3", "llm_adapter_path", "t5_tokenizer_path",
                                  "qwen3_max_token_length", "t5_max_token_length", "vae_disable_cache",
                                  "unsloth_offload_checkpointing", "qwen_image_vae_2d", "compile", "torch_compile",
                                  "compile_backend", "compile_mode", "compile_dynamic", "compile_fullgraph",
                                  "compile_cache_size_limit", "cache_text_encoder_outputs",
                                  "cache_text_encoder_outputs_to_disk")},
    "lumina_checkbox": {
        k: f"lumina_{k}" for k in ("ae", "gemma2", "gemma2_max_token_length", "system_prompt", "use_flash_attn",
                                   "use_sage_attn", "discrete_flow_shift", "model_prediction_type",
                                   "timestep_sampling", "sigmoid_scale", "cache_text_encoder_outputs",
                                   "cache_text_encoder_outputs_to_disk")},
}
# Keys the LoRA tab writes from a same-named field only with one family's checkbox.
_FAMILY_ONLY = {
    "flux1_checkbox": {"ae", "clip_l", "t5xxl", "split_mode", "t5xxl_max_token_length", "guidance_scale",
                       "mem_eff_save", "apply_t5_attn_mask", "cpu_offload_checkpointing", "blocks_to_swap",
                       "single_blocks_to_swap", "double_blocks_to_swap", "discrete_flow_shift",
                       "model_prediction_type", "timestep_sampling", "fp8_base_unet"},
    "sd3_checkbox": {"clip_g", "clip_g_dropout_rate", "logit_mean", "logit_std", "mode_scale",
                     "pos_emb_random_crop_rate", "save_clip", "save_t5xxl", "t5xxl_device", "t5xxl_dtype",
                     "weighting_scheme", "blocks_to_swap"},
    "sdxl": set(),
    "hunyuan_image_checkbox": {"blocks_to_swap"},
    "anima_checkbox": {"blocks_to_swap"},
    "lumina_checkbox": {"blocks_to_swap"},
}
# Same-named LoRA-tab fields that train_model writes under their own name, whatever the family.
_SAME = {
    "async_upload", "bucket_no_upscale", "bucket_reso_steps", "cache_latents", "cache_latents_to_disk",
    "caption_dropout_every_n_epochs", "caption_dropout_rate", "caption_extension", "clip_skip", "color_aug",
    "debiased_estimation_loss", "dim_from_weights", "enable_bucket", "flip_aug", "fp8_base", "full_bf16",
    "full_fp16", "gradient_accumulation_steps", "gradient_checkpointing", "highvram", "huber_c", "huber_scale",
    "huber_schedule", "huggingface_repo_id", "huggingface_token", "huggingface_repo_type",
    "huggingface_repo_visibility", "huggingface_path_in_repo", "ip_noise_gamma", "ip_noise_gamma_random_strength",
    "keep_tokens", "logging_dir", "log_config", "log_tracker_name", "log_tracker_config",
    "loss_type", "lr_scheduler", "lr_scheduler_num_cycles", "lr_scheduler_power", "lr_scheduler_type",
    "masked_loss", "max_bucket_reso", "max_grad_norm", "max_timestep", "max_train_epochs", "max_train_steps",
    "mem_eff_attn", "metadata_author", "metadata_description", "metadata_license", "metadata_tags",
    "metadata_title", "min_bucket_reso", "min_snr_gamma", "min_timestep", "mixed_precision", "network_alpha",
    "network_dim", "network_dropout", "network_weights", "output_dir", "output_name",
    "persistent_data_loader_workers", "pretrained_model_name_or_path", "prior_loss_weight", "random_crop",
    "reg_data_dir", "resume", "resume_from_huggingface", "sample_every_n_epochs", "sample_every_n_steps",
    "sample_sampler", "save_every_n_epochs", "save_every_n_steps", "save_last_n_steps",
    "save_last_n_steps_state", "save_last_n_epochs", "save_last_n_epochs_state", "save_model_as",
    "save_precision", "save_state", "save_state_on_train_end", "save_state_to_huggingface",
    "scale_v_pred_loss_like_noise_pred", "scale_weight_norms", "seed", "shuffle_caption", "skip_cache_check",
    "train_batch_size", "training_comment", "log_with", "v2", "v_parameterization", "v_pred_like_loss", "vae",
    "vae_batch_size", "wandb_api_key", "wandb_run_name", "weighted_captions", "max_data_loader_n_workers",
}
# Fields whose value in a fresh tab the GUI writes whether or not the plan sets the key; the
# value a plan without the key gets is sd-scripts' own default (or, for these, its equivalent).
_WRITTEN_ANYWAY = {"bucket_reso_steps", "max_data_loader_n_workers"}

# The LyCORIS algos the LoRA tab has a LoRA_type for: algo -> (LoRA_type, network_args -> field).
_LYCORIS_TYPES = {
    "boft": "LyCORIS/BOFT", "diag-oft": "LyCORIS/Diag-OFT", "dylora": "LyCORIS/DyLoRA", "glora": "LyCORIS/GLoRA",
    "ia3": "LyCORIS/iA3", "locon": "LyCORIS/LoCon", "loha": "LyCORIS/LoHa", "lokr": "LyCORIS/LoKr",
    "full": "LyCORIS/Native Fine-Tuning",
}
_LYCORIS_ARG_FIELD = {"preset": "LyCORIS_preset", "block_size": "unit", "constraint": "constrain"}
# Booleans the tab writes as `name=True/False`; LyCORIS' wrapper reads a "False" string as false
# for these (str_bool), so the GUI's `name=False` means the wrapper's default.
_LYCORIS_BOOL = {"use_tucker", "bypass_mode", "dora_wd", "use_scalar", "rank_dropout_scale", "train_norm",
                 "use_cp", "decompose_both", "rescaled", "train_on_input"}

_NO_SPACE = re.compile(r'^[^\s"]+$')
_HINT = "Train with the sd-scripts TOML kohya-tuner wrote (config.toml with launch.sh, or fit's --out) instead."


@dataclass
class GuiExport:
    """The GUI file's fields, and what the user should know about it."""

    fields: dict[str, Any]
    additional: list[str] = field(default_factory=list)  # the keys passed through additional_parameters
    notes: list[str] = field(default_factory=list)

    def dumps(self) -> str:
        # The GUI's own Save writes indented JSON with one field per line.
        return json.dumps(self.fields, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _fresh() -> dict[str, Any]:
    return {name: fresh for name, (_kind, fresh) in _fields()["lora"].items()}


def _kind(name: str) -> str:
    return _fields()["lora"][name][0]


def _empty(name: str) -> Any:
    """The value of a field that makes the LoRA tab leave its key out (it drops "", False, 0)."""
    return {"bool": False, "text": ""}.get(_kind(name), 0)


def _args_dict(args: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in args or []:
        key, sep, value = str(item).partition("=")
        if not sep:
            raise UserError(f"network_args item {item!r} is not key=value; the kohya_ss GUI has no field for it.")
        out[key.strip()] = value.strip()
    return out


def _lycoris(config: dict[str, Any], f: dict[str, Any]) -> set[str]:
    """LoRA_type and fields for `network_module = "lycoris.kohya"`; returns the network_args keys used."""
    args = _args_dict(config.get("network_args"))
    algo = args.get("algo", "lora").lower()
    if algo not in _LYCORIS_TYPES:
        raise UserError(f"LyCORIS algo {algo!r} has no LoRA_type in the kohya_ss GUI (it has "
                        f"{', '.join(sorted(_LYCORIS_TYPES))}).", _HINT)
    f["LoRA_type"] = _LYCORIS_TYPES[algo]
    # LyCORIS' wrapper takes conv_dim/conv_alpha as network_dim/network_alpha when unset (or 0); the
    # GUI always writes both, so they get the values the wrapper would use.
    f["conv_dim"] = config.get("network_dim", 4)
    f["conv_alpha"] = config.get("network_alpha", 1)
    for name in _LYCORIS_BOOL:
        if name in f:
            f[name] = False
    f["LyCORIS_preset"] = "full"
    f["rank_dropout"] = f["module_dropout"] = 0
    f["factor"] = -1
    f["unit"] = 4  # LyCORIS' default block_size
    f["constrain"] = 0.0
    used = {"algo"}
    for key, value in args.items():
        if key == "algo":
            continue
        name = _LYCORIS_ARG_FIELD.get(key, key)
        if name not in f or key in ("conv_dim", "conv_alpha") and not value:
            continue
        if name in _LYCORIS_BOOL:
            if value.lower() not in ("true", "false"):
                continue
            f[name] = value.lower() == "true"
        elif name == "LyCORIS_preset":
            f[name] = value
        else:
            try:
                number = float(value)
            except ValueError:
                continue
            f[name] = int(number) if number == int(number) and "." not in value else number
        used.add(key)
    return used


# network_args the LoRA tab writes from a same-named field when it is set: per LoRA_type family.
_LORA_ARG_FIELDS = ["down_lr_weight", "mid_lr_weight", "up_lr_weight", "block_lr_zero_threshold", "block_dims",
                    "block_alphas", "conv_block_dims", "conv_block_alphas", "rank_dropout", "module_dropout"]
_LORAPLUS = ["loraplus_lr_ratio", "loraplus_unet_lr_ratio", "loraplus_text_encoder_lr_ratio"]


def _number(text: str) -> int | float:
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"network_args value {text!r} is not a number; the kohya_ss GUI's field for it is.") from None
    return int(value) if value == int(value) and "." not in text else value


def _set_arg_fields(args: dict[str, str], f: dict[str, Any], names: list[str]) -> set[str]:
    """Fields for network_args pairs the tab writes back as `name=value` when the field is set."""
    used = set()
    for name in names:
        if name not in args or name not in f:
            continue
        value = args[name]
        if _kind(name) == "text":
            f[name] = value
        else:
            try:
                f[name] = float(value)
            except ValueError:
                continue
            if not f[name]:
                continue  # 0 is what the tab leaves out; the pair stays for additional handling
        used.add(name)
    return used


def _network(config: dict[str, Any], f: dict[str, Any], box: str | None) -> set[str]:
    """LoRA_type and its fields; returns the network_args keys the fields carry."""
    used = _network_type(config, f, box)
    if config.get("network_module") != "lycoris.kohya":
        used |= _set_arg_fields(_args_dict(config.get("network_args")), f, _LORAPLUS)
    return used


def _network_type(config: dict[str, Any], f: dict[str, Any], box: str | None) -> set[str]:
    module = config.get("network_module")
    args = _args_dict(config.get("network_args"))
    if module == "lycoris.kohya":
        return _lycoris(config, f)
    if box == "flux1_checkbox":
        if module != "networks.lora_flux":
            raise UserError(f"network_module {module!r} with FLUX.1: the kohya_ss GUI's FLUX.1 LoRA types launch "
                            "networks.lora_flux or LyCORIS.", _HINT)
        f["LoRA_type"] = "Flux1"
        used = set()
        # A fresh tab says "all" here, which the GUI passes on; unset means the same to lora_flux.
        f["train_double_block_indices"] = f["train_single_block_indices"] = ""
        for key in ("img_attn_dim", "img_mlp_dim", "img_mod_dim", "single_dim", "txt_attn_dim", "txt_mlp_dim",
                    "txt_mod_dim", "single_mod_dim", "in_dims", "train_double_block_indices",
                    "train_single_block_indices"):
            if key in args:
                f[key] = args[key]
                used.add(key)
        if args.get("train_t5xxl", "").lower() == "true":
            f["train_t5xxl"] = True
            used.add("train_t5xxl")
        if args.get("split_qkv", "").lower() == "true":
            f["split_qkv"] = True
            used.add("split_qkv")
        if "ggpo_beta" in args and "ggpo_sigma" in args:
            f["train_lora_ggpo"] = True
            used |= _set_arg_fields(args, f, ["ggpo_beta", "ggpo_sigma"])
        return used | _set_arg_fields(args, f, ["rank_dropout", "module_dropout"])
    if box in _DIT_TYPES:
        lora_type, expected = _DIT_TYPES[box]
        if module != expected:
            raise UserError(f"network_module {module!r}: the kohya_ss GUI's {lora_type} LoRA type launches {expected}.",
                            _HINT)
        f["LoRA_type"] = lora_type
        return _set_arg_fields(args, f, ["rank_dropout", "module_dropout"])
    expected = "networks.lora_sd3" if box == "sd3_checkbox" else "networks.lora"
    if module != expected:
        raise UserError(f"network_module {module!r}: the kohya_ss GUI's LoRA tab launches {expected} for this model "
                        "(or LyCORIS); it has no field for another module.",
                        _HINT)
    if "conv_dim" in args and box != "sd3_checkbox":
        f["LoRA_type"] = "Kohya LoCon"
        # Number fields: the form refuses a string there.
        f["conv_dim"], f["conv_alpha"] = _number(args["conv_dim"]), _number(args.get("conv_alpha", "1"))
        return {"conv_dim", "conv_alpha"} | _set_arg_fields(args, f, _LORA_ARG_FIELDS)
    f["LoRA_type"] = "Standard"
    return _set_arg_fields(args, f, _LORA_ARG_FIELDS)


def _cli_words(key: str, value: Any, spec) -> list[str] | None:
    """`--key value…` for additional_parameters, or None when the GUI cannot pass the value (it
    drops double quotes and splits on whitespace)."""
    if value is None or value is False:
        return []
    if value is True:
        return [f"--{key}"] if spec is not None and spec.type.startswith("bool") else [f"--{key}", "True"]
    items = value if isinstance(value, list) else [value]
    words = [str(v).lower() if isinstance(v, bool) else str(v) for v in items]
    if not words or not all(_NO_SPACE.match(w) for w in words):
        return None
    return [f"--{key}", *words]


def export(config: dict[str, Any], script: str, *, dataset_config: str | None, sample_prompts: str | None,
           launch: list[str] | None = None, schnell: bool | None = False) -> GuiExport:
    """The kohya_ss GUI LoRA-tab file for `config` (flat sd-scripts keys) trained by `script`.

    dataset_config: the --dataset_config file the plan trains from (None: the config's own
    train_data_dir or dataset_config). sample_prompts: the text of the prompt file the config's
    sample_prompts names (the GUI holds the prompts themselves and writes its own file), or None
    when it could not be read. launch: the `accelerate launch` options the plan runs with.
    schnell: whether a FLUX.1 model is schnell (None: not known)."""
    if script not in _SCRIPT_BOX:
        raise UserError(f"{script} is not launched by the kohya_ss GUI's LoRA tab, the only tab kohya-tuner "
                        "writes files for.", _HINT)
    box = _SCRIPT_BOX[script]
    specs = schema.script_args(script)
    f = _fresh()
    for name in ("sdxl", "flux1_checkbox", "sd3_checkbox", "hunyuan_image_checkbox", "anima_checkbox",
                 "lumina_checkbox"):
        f[name] = name == box
    todo = {k: v for k, v in config.items() if v is not None}
    notes: list[str] = []

    # The network and its arguments.
    used_args = _network(todo, f, box)
    todo.pop("network_module", None)
    rest_args = [f"{k}={v}" for k, v in _args_dict(todo.pop("network_args", None)).items() if k not in used_args]

    # Settings whose field is named otherwise, or is one family's; origin: field -> key.
    origin: dict[str, str] = {}
    renamed = {**_RENAMED, **_FAMILY_RENAMED.get(box or "", {})}
    only = _FAMILY_ONLY.get(box or "", set())
    # Written even when 0: for Chroma the GUI puts guidance_scale back after its filter.
    kept_zero = _WRITTEN_ANYWAY | ({"guidance_scale"} if config.get("model_type") == "chroma" else set())
    for key in list(todo):
        target = renamed.get(key) or (key if key in _SAME or key in only else None)
        if target is None or target not in f:
            continue
        value = todo[key]
        default = specs[key].default if key in specs else None
        if key not in kept_zero and not isinstance(value, bool) and isinstance(value, (int, float)) \
                and value == 0 and default != 0:
            # The LoRA tab leaves 0 out of its TOML (0 == False), which would mean sd-scripts'
            # default (max_grad_norm 1.0, seed random): 0 goes on the command line instead.
            f[target] = value
            continue
        f[target] = todo.pop(key)
        origin[target] = key
    # Fields the plan does not set: the value that leaves the key out of the GUI's TOML.
    for key in _SAME | set(renamed):
        name = renamed.get(key, key)
        if key in config or name not in f:
            continue
        if key in _WRITTEN_ANYWAY:
            if key in specs and specs[key].default is not None:
                f[name] = specs[key].default
        elif _kind(name) != "choice":
            # sd-scripts' default where it has one (a Number field may refuse 0: its minimum is 1),
            # else the value the tab leaves out.
            default = specs[key].default if key in specs else None
            f[name] = default if isinstance(default, (int, float)) and _kind(name) != "text" else _empty(name)
        elif key in specs and isinstance(specs[key].default, str):
            f[name] = specs[key].default  # a dropdown always gives a value: sd-scripts' own default
    if box == "sd3_checkbox" and "text_encoder_batch_size" not in config:
        # The field's minimum is 1 and the GUI always writes it; unset, sd-scripts caches the
        # text encoders' outputs in batches of train_batch_size (train_util.py), so that it is.
        f["sd3_text_encoder_batch_size"] = config.get("train_batch_size", 1)
    if box == "lumina_checkbox" and "gemma2_max_token_length" not in config:
        # The field's minimum is 1; unset, sd-scripts uses 256 (strategy_lumina.py).
        f["lumina_gemma2_max_token_length"] = 256
    if box == "flux1_checkbox" and "t5xxl_max_token_length" not in config:
        # The GUI always writes it; sd-scripts' own default is 256 for schnell, else 512.
        f["t5xxl_max_token_length"] = 256 if schnell else 512
        if schnell is None:
            notes.append("t5xxl_max_token_length is written as 512, as the GUI always writes one: right for FLUX.1 "
                         "dev and Chroma; for a schnell model set it to 256 in the GUI (sd-scripts' default there)")
    if box == "flux1_checkbox" and config.get("model_type") == "chroma":
        f["model_type"] = "chroma"
        todo.pop("model_type", None)
        # The GUI sets apply_t5_attn_mask itself for Chroma.
        todo.pop("apply_t5_attn_mask", None)

    # Attention: one dropdown for xformers / sdpa / neither.
    f["xformers"] = "xformers" if todo.pop("xformers", False) else "sdpa" if todo.pop("sdpa", False) else "none"

    # Learning rates: the GUI derives network_train_unet_only / _text_encoder_only from which of
    # text_encoder_lr and unet_lr is 0, and sd-scripts uses learning_rate where unet_lr is unset.
    lr = todo.pop("learning_rate", None)
    unet = todo.pop("unet_lr", None)
    te = todo.pop("text_encoder_lr", None)
    if isinstance(te, list) and len(set(te)) <= 1:
        te = te[0] if te else None
    if isinstance(te, list):
        # Two different rates: the field holds the first (so the GUI still trains the text
        # encoders) and the list passes whole through additional_parameters.
        todo["text_encoder_lr"] = te
        te = te[0]
    unet_only = bool(todo.pop("network_train_unet_only", False))
    te_only = bool(todo.pop("network_train_text_encoder_only", False))
    base_lr = lr if lr is not None else specs["learning_rate"].default if "learning_rate" in specs else 1e-4
    f["learning_rate"] = lr if lr is not None else 0
    if te_only:
        f["unet_lr"], f["text_encoder_lr"] = 0, te or base_lr
    elif unet_only:
        f["unet_lr"], f["text_encoder_lr"] = unet or base_lr, 0
        if te and "text_encoder_lr" not in todo:
            todo["text_encoder_lr"] = te  # unused when only the U-Net trains; passed on all the same
    elif te is None and unet is None:
        f["unet_lr"] = f["text_encoder_lr"] = 0  # the GUI then writes learning_rate alone
    else:
        # sd-scripts trains what has no rate of its own at learning_rate.
        f["unet_lr"], f["text_encoder_lr"] = unet or base_lr, te or base_lr
    if f["learning_rate"] == 0 and f["unet_lr"] == 0 and f["text_encoder_lr"] == 0:
        f["learning_rate"] = base_lr

    # Warmup: steps go in the steps field; a fraction of the run the GUI would turn into percent
    # of max_train_steps with its own rounding, so it passes as it is.
    warm = todo.pop("lr_warmup_steps", None)
    f["lr_warmup"] = 0
    f["lr_warmup_steps"] = 0
    ds_given = dataset_config if dataset_config is not None else config.get("dataset_config")
    if isinstance(warm, int) and not isinstance(warm, bool) and (f.get("max_train_steps") or not ds_given):
        # (With a dataset config and no max_train_steps the GUI sets the warmup to 0.)
        f["lr_warmup_steps"] = warm
    elif warm is not None:
        todo["lr_warmup_steps"] = warm

    # optimizer_args / lr_scheduler_args: the GUI's `key=value key=value` text.
    for key in ("optimizer_args", "lr_scheduler_args"):
        items = todo.pop(key, None)
        if not items:
            f[key] = ""
            continue
        words = [str(i) for i in (items if isinstance(items, list) else [items])]
        if not all(_NO_SPACE.match(w) and "=" in w for w in words):
            raise UserError(f"{key} = {items!r}: the kohya_ss GUI's {key} field holds key=value pairs without "
                            "spaces or double quotes, so it cannot carry this value.",
                            _HINT)
        f[key] = " ".join(words)

    # The dataset and the sample prompts.
    ds = dataset_config if dataset_config is not None else todo.pop("dataset_config", None)
    todo.pop("dataset_config", None)
    f["dataset_config"] = str(ds) if ds else ""
    f["train_data_dir"] = str(todo.pop("train_data_dir", "")) if not ds else ""
    if not ds and "train_data_dir" in config:
        notes.append("the GUI reads train_data_dir as kohya's folder layout (<repeats>_<name> folders), as "
                     "sd-scripts does without a dataset config")
    prompts_path = todo.pop("sample_prompts", None)
    f["sample_prompts"] = ""
    if prompts_path is not None:
        if sample_prompts is not None:
            f["sample_prompts"] = sample_prompts
        else:
            todo["sample_prompts"] = prompts_path
            notes.append(f"the prompt file {prompts_path} could not be read, so the GUI gets its path through "
                         "additional_parameters")
    # The GUI writes epoch and noise_offset_type for itself; neither is a sd-scripts argument.
    f["epoch"] = 1
    f["stop_text_encoder_training"] = 0
    f["max_token_length"] = todo.pop("max_token_length", 75)

    # accelerate launch options (the GUI's Accelerate launch fields).
    _launch_fields(launch or [], f)

    # What is left has no field: additional_parameters, which argparse reads after --config_file.
    extra: list[str] = []
    passed: list[str] = []
    if rest_args:
        words = ["--network_args", *rest_args]
        raise UserError(f"network_args {' '.join(rest_args)} have no kohya_ss GUI field for LoRA_type "
                        f"{f['LoRA_type']!r}, and additional_parameters would replace the network_args the GUI "
                        f"writes ({' '.join(words[1:])}).", _HINT)
    # A value the GUI's form would refuse when the button is pressed (a rank above its slider, a
    # caption extension outside its list): the field gets one it accepts and the value itself
    # goes on the command line, where it wins.
    for name, limit in field_limits("lora").items():
        if name in f and not within(f[name], limit):
            if name not in origin:
                raise UserError(f"The kohya_ss GUI's {name} field cannot hold {f[name]!r} "
                                f"({_limit_text(limit)}), and no other field or option carries it.",
                                _HINT)
            todo[origin[name]] = f[name]
            f[name] = _nearest(f[name], limit, _fresh()[name])
    for key in sorted(todo):
        spec = specs.get(key)
        if spec is None:
            raise UserError(f"{key} is not an argument of {script}, so it cannot go into the kohya_ss GUI's "
                            "additional_parameters (argparse refuses unknown flags on the command line).",
                            f"Remove {key} from the config, or train with the sd-scripts TOML kohya-tuner wrote.")
        words = _cli_words(key, todo[key], spec)
        if words is None:
            raise UserError(f"{key} = {todo[key]!r} has no kohya_ss GUI field, and the GUI's additional_parameters "
                            "split values at spaces and drop double quotes, so it cannot carry this value.",
                            _HINT)
        if words:
            extra += words
            passed.append(key)
    f["additional_parameters"] = " ".join(extra)
    if passed:
        notes.append("no GUI field for " + ", ".join(passed) + ": passed in the GUI's additional_parameters "
                     "(Advanced > Additional parameters), which follow --config_file on the command line")
    return GuiExport(dict(sorted(f.items())), passed, notes)


_LAUNCH_VALUES = ("dynamo_backend", "dynamo_mode", "gpu_ids", "main_process_port", "mixed_precision",
                  "num_processes", "num_machines", "num_cpu_threads_per_process")
_LAUNCH_FLAGS = ("dynamo_use_fullgraph", "dynamo_use_dynamic", "multi_gpu")


def _limit_text(limit: dict[str, Any]) -> str:
    if "choices" in limit:
        return "it offers " + ", ".join(repr(c) for c in limit["choices"])
    return f"its range is {limit.get('min', '-inf')} to {limit.get('max', 'inf')}"


def _nearest(value: Any, limit: dict[str, Any], fresh: Any) -> Any:
    if "choices" in limit:
        return fresh if fresh in limit["choices"] else limit["choices"][0]
    if isinstance(value, (int, float)):
        return min(max(value, limit.get("min", value)), limit.get("max", value))
    return fresh


def _launch_fields(launch: list[str], f: dict[str, Any]) -> None:
    """The GUI's Accelerate launch fields from `accelerate launch` options; an option without a
    field goes to its extra_accelerate_launch_args (which it splits at spaces)."""
    f.update(dynamo_backend="no", num_processes=1, num_machines=1, num_cpu_threads_per_process=2,
             extra_accelerate_launch_args="")
    extra: list[str] = []
    i = 0
    while i < len(launch):
        word = str(launch[i])
        key = word[2:] if word.startswith("--") else None
        if key in _LAUNCH_FLAGS:
            f[key] = True
            i += 1
        elif key in _LAUNCH_VALUES and i + 1 < len(launch):
            value = str(launch[i + 1])
            f[key] = int(value) if _kind(key) in ("int", "number") and value.isdigit() else value
            i += 2
        else:
            if not _NO_SPACE.match(word):
                raise UserError(f"The accelerate option {word!r} holds a space or a double quote, which the kohya_ss "
                                "GUI's extra accelerate arguments field cannot carry.")
            extra.append(word)
            i += 1
    f["extra_accelerate_launch_args"] = " ".join(extra)


def for_plan(plan, dataset_path: str, prompts_text: str | None, gpu_ids: tuple[int, ...] = ()) -> GuiExport:
    """The GUI file for a composed plan (kohya_tuner.presets.Plan) written with its dataset.toml
    at `dataset_path` and its prompt file holding `prompts_text`, on the cards `gpu_ids`."""
    from kohya_tuner.planfiles import accelerate_args

    schnell = plan.variant == "schnell" if plan.family.script == "flux_train_network.py" else False
    return export(plan.config, plan.family.script, dataset_config=str(dataset_path), sample_prompts=prompts_text,
                  launch=accelerate_args(plan.config.get("mixed_precision", "no"), gpu_ids), schnell=schnell)


def for_config(config: dict[str, Any], script: str, *, dataset_config: str | None, launch: list[str] | None,
               read_prompts) -> GuiExport:
    """The GUI file for a fitted config. `read_prompts(path)` gives the text of the prompt file the
    config's sample_prompts names, or None when it cannot be read (the path then passes as is)."""
    from kohya_tuner.planfiles import accelerate_args

    prompts = read_prompts(config["sample_prompts"]) if config.get("sample_prompts") else None
    if not launch:
        launch = accelerate_args(config.get("mixed_precision", "no"))
    schnell = None if script == "flux_train_network.py" and config.get("model_type") != "chroma" else False
    return export(config, script, dataset_config=dataset_config, sample_prompts=prompts, launch=launch,
                  schnell=schnell)
