"""The kohya_ss GUI's LoRA tab (lora_gui.train_model) as config_gui reads it: the network each
LoRA_type launches and the TOML the tab writes, for every model checkbox (docs/kohya-gui.md)."""

from __future__ import annotations

from typing import Any

from kohya_tuner.config_gui_form import (
    _as_float,
    _as_int,
    _check_args_fields,
    _drop_unset_lora,
    _Form,
    _gui_split,
    _nz,
    _sample_and_save_keys,
    _refuse,
    _warmup,
)


# ---- the LoRA tab (lora_gui.train_model) ---------------------------------------------------

_LYCORIS_ALGOS = {
    # LoRA_type: (algo as written, the form fields it passes, in the GUI's order)
    "LyCORIS/BOFT": ("boft", ["preset", "conv_dim", "conv_alpha", "module_dropout", "use_tucker", "rank_dropout",
                              "rank_dropout_scale", "algo", "train_norm"]),
    "LyCORIS/Diag-OFT": ("diag-oft", ["preset", "conv_dim", "conv_alpha", "module_dropout", "use_tucker",
                                      "rank_dropout", "rank_dropout_scale", "constraint", "rescaled", "algo",
                                      "train_norm"]),
    "LyCORIS/DyLoRA": ("dylora", ["preset", "conv_dim", "conv_alpha", "use_tucker", "block_size", "rank_dropout",
                                  "module_dropout", "algo", "train_norm"]),
    "LyCORIS/GLoRA": ("glora", ["preset", "conv_dim", "conv_alpha", "use_tucker", "rank_dropout", "module_dropout",
                                "rank_dropout_scale", "algo", "train_norm"]),
    "LyCORIS/iA3": ("ia3", ["preset", "conv_dim", "conv_alpha", "train_on_input", "algo"]),
    "LyCORIS/LoCon": ("locon", ["preset", "conv_dim", "conv_alpha", "use_tucker", "rank_dropout", "bypass_mode",
                                "dora_wd", "module_dropout", "use_tucker", "use_scalar", "rank_dropout_scale", "algo",
                                "train_norm"]),
    "LyCORIS/LoHa": ("loha", ["preset", "conv_dim", "conv_alpha", "use_tucker", "rank_dropout", "bypass_mode",
                              "dora_wd", "module_dropout", "use_tucker", "use_scalar", "rank_dropout_scale", "algo",
                              "train_norm"]),
    "LyCORIS/LoKr": ("lokr", ["preset", "conv_dim", "conv_alpha", "use_tucker", "rank_dropout", "bypass_mode",
                              "dora_wd", "module_dropout", "factor", "use_cp", "use_scalar", "decompose_both",
                              "rank_dropout_scale", "algo", "train_norm"]),
    "LyCORIS/Native Fine-Tuning": ("full", ["preset", "rank_dropout", "module_dropout", "rank_dropout_scale", "algo",
                                            "train_norm"]),
}
# network_args names whose form field has another name
_LYCORIS_FIELD = {"preset": "LyCORIS_preset", "block_size": "unit", "constraint": "constrain"}
_BLOCK_FIELDS = ["down_lr_weight", "mid_lr_weight", "up_lr_weight", "block_lr_zero_threshold", "block_dims",
                 "block_alphas", "conv_block_dims", "conv_block_alphas", "rank_dropout", "module_dropout"]
_FLUX_LORA_FIELDS = ["img_attn_dim", "img_mlp_dim", "img_mod_dim", "single_dim", "txt_attn_dim", "txt_mlp_dim",
                     "txt_mod_dim", "single_mod_dim", "in_dims", "train_double_block_indices",
                     "train_single_block_indices"]


def _truthy_pairs(f: _Form, names: list[str]) -> list[str]:
    return [f"{n}={f[n]}" for n in names if f.get(n)]


def _dropout_pairs(f: _Form) -> list[str]:
    return [f"{n}={f[n]}" for n in ("rank_dropout", "module_dropout") if f.get(n) is not None and _as_float(f[n], 0) > 0]


def lora_network(f: _Form) -> tuple[str | None, list[str]]:
    """network_module and network_args the LoRA tab passes for its LoRA_type."""
    t = f.LoRA_type
    module: str | None = None
    args: list[str] = []
    if t in _LYCORIS_ALGOS:
        module = "lycoris.kohya"
        algo, names = _LYCORIS_ALGOS[t]
        args = [f"algo={algo}" if n == "algo" else f"{n}={f[_LYCORIS_FIELD.get(n, n)]}" for n in names]
    elif t == "Flux1":
        module = "networks.lora_flux"
        names = _FLUX_LORA_FIELDS + (["ggpo_beta", "ggpo_sigma"] if f.get("train_lora_ggpo") else [])
        args = _truthy_pairs(f, [n for n in _FLUX_LORA_FIELDS + ["ggpo_beta", "ggpo_sigma"] if n in names])
        if f.get("split_mode"):
            args.append("train_blocks=single")
        if f.get("split_qkv"):
            args.append("split_qkv=True")
        if f.get("train_t5xxl") and f.flux1_checkbox:
            args.append("train_t5xxl=True")
        args += _dropout_pairs(f)
    elif t == "Flux1 OFT":
        module = "networks.oft_flux"
        args = _truthy_pairs(f, ["enable_all_linear"])
    elif t in ("Kohya LoHa", "Kohya LoKr"):
        module = "networks.lokr" if t == "Kohya LoKr" else "networks.loha"
        if f.get("conv_dim") is not None and _as_float(f.conv_dim, 0) > 0:
            args.append(f"conv_dim={int(f.conv_dim)}")
            if f.get("conv_alpha") is not None:
                a = f.conv_alpha
                args.append(f"conv_alpha={int(a) if float(a) == int(a) else a}")
        if f.get("use_tucker"):
            args.append("use_tucker=True")
        if t == "Kohya LoKr" and f.get("factor") is not None and int(f.factor) != -1:
            args.append(f"factor={int(f.factor)}")
        args += _dropout_pairs(f)
    elif t in ("Kohya LoCon", "Standard"):
        module = "networks.lora_sd3" if f.get("sd3_checkbox") else "networks.lora"
        if t == "Kohya LoCon":
            args += [f"conv_dim={f.conv_dim}", f"conv_alpha={f.conv_alpha}"]
        args += _truthy_pairs(f, _BLOCK_FIELDS)
    elif t in _DIT_LORA_TYPES:
        module = _DIT_LORA_TYPES[t]
        args = _dropout_pairs(f)
    elif t == "LoRA-FA":
        module = "networks.lora_fa"
        args = _truthy_pairs(f, _BLOCK_FIELDS)
    elif t == "Kohya DyLoRA":
        module = "networks.dylora"
        args = _truthy_pairs(f, ["conv_dim", "conv_alpha"] + _BLOCK_FIELDS + ["unit"])
    for key in ("loraplus_lr_ratio", "loraplus_unet_lr_ratio", "loraplus_text_encoder_lr_ratio"):
        if f.get(key):
            args.append(f"{key}={f[key]}")
    # The GUI builds one string and splits it on spaces, dropping double quotes.
    return module, _gui_split(" ".join(args))


_OTHER_MODELS = ("hunyuan_image_checkbox", "anima_checkbox", "lumina_checkbox")
# LoRA types of the LoRA tab's newer model checkboxes and the module each launches.
_DIT_LORA_TYPES = {"HunyuanImage-2.1": "networks.lora_hunyuan_image", "Anima": "networks.lora_anima",
                   "Lumina": "networks.lora_lumina"}


def _lora_toml(f: _Form) -> tuple[str, dict[str, Any]]:
    _check_args_fields(f)
    sdxl, flux, sd3 = bool(f.sdxl), bool(f.flux1_checkbox), bool(f.sd3_checkbox)
    hy, an, lu = bool(f.hunyuan_image_checkbox), bool(f.anima_checkbox), bool(f.lumina_checkbox)
    dit = hy or an or lu
    if flux and f.LoRA_type not in ("Flux1", "Flux1 OFT") and "LyCORIS" not in f.LoRA_type:
        _refuse(f"LoRA_type {f.LoRA_type!r} with flux1_checkbox set: the GUI wants 'Flux1', 'Flux1 OFT' or a "
                "LyCORIS type for FLUX.1.")
    if an and f.LoRA_type not in ("Anima", "Kohya LoHa", "Kohya LoKr"):
        _refuse(f"LoRA_type {f.LoRA_type!r} with anima_checkbox set: the GUI wants 'Anima', 'Kohya LoHa' or "
                "'Kohya LoKr'.")
    if lu and f.LoRA_type != "Lumina":
        _refuse(f"LoRA_type {f.LoRA_type!r} with lumina_checkbox set: the GUI wants 'Lumina'.")
    if f.LoRA_type in ("Kohya LoHa", "Kohya LoKr") and not (sdxl or an):
        _refuse(f"LoRA_type {f.LoRA_type!r} needs the SDXL or Anima checkbox.")
    if f.LoRA_type in ("Kohya LoHa", "Kohya LoKr") and (flux or sd3 or hy or lu):
        _refuse(f"LoRA_type {f.LoRA_type!r} does not go with FLUX.1, SD3, HunyuanImage-2.1 or Lumina.")
    if (f.LoRA_type == "Anima" and not an) or (f.LoRA_type == "Lumina" and not lu):
        _refuse(f"LoRA_type {f.LoRA_type!r} needs that model's checkbox.")
    if _as_int(f.bucket_reso_steps, 1) < 1:
        _refuse("bucket_reso_steps must be 1 or more.")
    if not 0 <= _as_float(f.noise_offset, 0) <= 1:
        _refuse(f"noise_offset = {f.noise_offset} is outside 0 to 1.")
    script = ("sdxl_train_network.py" if sdxl else "flux_train_network.py" if flux else
              "sd3_train_network.py" if sd3 else "hunyuan_image_train_network.py" if hy else
              "anima_train_network.py" if an else "lumina_train_network.py" if lu else "train_network.py")
    inpaint = bool(f.train_inpainting) and not (flux or sd3 or dit)
    cache_latents = f.cache_latents and not inpaint
    cache_latents_to_disk = f.cache_latents_to_disk and not inpaint
    max_train_steps = f.max_train_steps
    lr_warmup, lr_warmup_steps = f.lr_warmup, f.lr_warmup_steps
    if f.dataset_config:
        if max_train_steps > 0:
            if _as_float(lr_warmup_steps if lr_warmup_steps not in ("", None) else 0, 0) <= 0 and \
                    _as_float(lr_warmup if lr_warmup not in ("", None) else 0, 0) != 0:
                lr_warmup_steps = round(_as_float(lr_warmup, 0) * int(max_train_steps) / 100)
                lr_warmup = 0
        else:
            lr_warmup_steps = 0
    elif max_train_steps == 0:
        # The GUI counts the images under train_data_dir here; a file alone names none.
        max_train_steps = 0
    warmup = _warmup(lr_warmup, lr_warmup_steps)
    module, net_args = lora_network(f)
    te, unet, t5 = (_as_float(f.text_encoder_lr, 0.0) if f.text_encoder_lr is not None else 0.0,
                    _as_float(f.unet_lr, 0.0) if f.unet_lr is not None else 0.0,
                    _as_float(f.t5xxl_lr, 0.0) if f.t5xxl_lr is not None else 0.0)
    if te == 0 and t5 > 0:
        _refuse("t5xxl_lr is set while text_encoder_lr is 0.")
    te_list = [te, t5] if te > 0 and t5 > 0 else [te, te] if te > 0 else None
    lr = _as_float(f.learning_rate, 0.0) if f.learning_rate is not None else 0.0
    if lr == 0 and te == 0 and unet == 0:
        _refuse("learning_rate, text_encoder_lr and unet_lr are all 0.", "Give a learning rate.")
    chroma = flux and str(f.get("model_type") or "").lower() == "chroma"
    original = f.noise_offset_type == "Original"
    multires = f.noise_offset_type == "Multires"
    only_flux = lambda v: v if flux else None  # noqa: E731
    only_sd3 = lambda v: v if sd3 else None  # noqa: E731
    c: dict[str, Any] = {
        "adaptive_noise_scale": f.adaptive_noise_scale if f.adaptive_noise_scale != 0 and original else None,
        "async_upload": f.async_upload,
        "bucket_no_upscale": f.bucket_no_upscale,
        "bucket_reso_steps": f.bucket_reso_steps,
        "cache_latents": cache_latents,
        "cache_latents_to_disk": cache_latents_to_disk,
        "cache_text_encoder_outputs": True if (sdxl and f.sdxl_cache_text_encoder_outputs) or (
            flux and f.flux1_cache_text_encoder_outputs) or (sd3 and f.sd3_cache_text_encoder_outputs) or (
            hy and f.hunyuan_image_cache_text_encoder_outputs) or (an and f.anima_cache_text_encoder_outputs) or (
            lu and f.lumina_cache_text_encoder_outputs) else None,
        "cache_text_encoder_outputs_to_disk": True if (flux and f.flux1_cache_text_encoder_outputs_to_disk) or (
            sd3 and f.sd3_cache_text_encoder_outputs_to_disk) or (
            hy and f.hunyuan_image_cache_text_encoder_outputs_to_disk) or (
            an and f.anima_cache_text_encoder_outputs_to_disk) or (
            lu and f.lumina_cache_text_encoder_outputs_to_disk) else None,
        "caption_dropout_every_n_epochs": int(f.caption_dropout_every_n_epochs),
        "caption_dropout_rate": f.caption_dropout_rate,
        "caption_extension": f.caption_extension,
        "clip_l": f.sd3_clip_l if sd3 else f.clip_l if flux and not chroma else None,
        "clip_skip": _nz(f.clip_skip) if not dit else None,
        "color_aug": f.color_aug,
        "dataset_config": f.dataset_config,
        "debiased_estimation_loss": f.debiased_estimation_loss,
        "dynamo_backend": f.dynamo_backend,
        "dim_from_weights": f.dim_from_weights,
        "disable_mmap_load_safetensors": only_sd3(f.sd3_disable_mmap_load_safetensors),
        "enable_bucket": f.enable_bucket,
        "epoch": int(f.epoch),
        "flip_aug": f.flip_aug,
        "fp8_base": f.fp8_base,
        "fp8_base_unet": only_flux(f.fp8_base_unet),
        "full_bf16": f.full_bf16,
        "full_fp16": f.full_fp16,
        "fused_backward_pass": only_sd3(f.sd3_fused_backward_pass),
        "gradient_accumulation_steps": int(f.gradient_accumulation_steps),
        "gradient_checkpointing": f.gradient_checkpointing,
        "highvram": f.highvram,
        "huber_c": f.huber_c,
        "huber_scale": f.huber_scale,
        "huber_schedule": f.huber_schedule,
        "huggingface_repo_id": f.huggingface_repo_id,
        "huggingface_token": f.huggingface_token,
        "huggingface_repo_type": f.huggingface_repo_type,
        "huggingface_repo_visibility": f.huggingface_repo_visibility,
        "huggingface_path_in_repo": f.huggingface_path_in_repo,
        "ip_noise_gamma": _nz(f.ip_noise_gamma),
        "ip_noise_gamma_random_strength": f.ip_noise_gamma_random_strength,
        "keep_tokens": int(f.keep_tokens),
        "learning_rate": lr,
        "logging_dir": f.logging_dir,
        "log_config": f.log_config,
        "log_tracker_name": f.log_tracker_name,
        "log_tracker_config": f.log_tracker_config,
        "loss_type": f.loss_type,
        "lr_scheduler": f.lr_scheduler,
        "lr_scheduler_args": _gui_split(f.lr_scheduler_args),
        "lr_scheduler_num_cycles": int(f.lr_scheduler_num_cycles) if f.lr_scheduler_num_cycles != "" else int(f.epoch),
        "lr_scheduler_power": f.lr_scheduler_power,
        "lr_scheduler_type": f.lr_scheduler_type if f.lr_scheduler_type != "" else None,
        "lr_warmup_steps": warmup,
        "masked_loss": f.masked_loss,
        "max_bucket_reso": f.max_bucket_reso,
        "max_grad_norm": f.max_grad_norm,
        "max_timestep": _nz(f.max_timestep),
        "max_token_length": int(f.max_token_length) if not (flux or dit) else None,
        "max_train_epochs": int(f.max_train_epochs) if int(f.max_train_epochs) != 0 else None,
        "max_train_steps": int(max_train_steps) if int(max_train_steps) != 0 else None,
        "mem_eff_attn": f.mem_eff_attn,
        "metadata_author": f.metadata_author,
        "metadata_description": f.metadata_description,
        "metadata_license": f.metadata_license,
        "metadata_tags": f.metadata_tags,
        "metadata_title": f.metadata_title,
        "min_bucket_reso": int(f.min_bucket_reso),
        "min_snr_gamma": _nz(f.min_snr_gamma),
        "min_timestep": _nz(f.min_timestep),
        "mixed_precision": f.mixed_precision,
        "multires_noise_discount": f.multires_noise_discount if multires else None,
        "multires_noise_iterations": f.multires_noise_iterations if f.multires_noise_iterations != 0 and multires
        else None,
        "network_alpha": f.network_alpha,
        "network_args": net_args,
        "network_dim": f.network_dim,
        "network_dropout": f.network_dropout,
        "network_module": module,
        # HunyuanImage trains the DiT only, whatever the rates say.
        "network_train_unet_only": hy or (te == 0 and unet != 0),
        "network_train_text_encoder_only": not hy and te != 0 and unet == 0,
        "network_weights": f.network_weights,
        "no_half_vae": True if sdxl and f.sdxl_no_half_vae else None,
        "noise_offset": f.noise_offset if f.noise_offset != 0 and original else None,
        "noise_offset_random_strength": f.noise_offset_random_strength if original else None,
        "noise_offset_type": f.noise_offset_type,
        "optimizer_type": f.optimizer,
        "optimizer_args": _gui_split(f.optimizer_args) if f.optimizer_args != [] else None,
        "output_dir": f.output_dir,
        "output_name": f.output_name,
        "persistent_data_loader_workers": int(f.persistent_data_loader_workers),
        "pretrained_model_name_or_path": f.pretrained_model_name_or_path,
        "prior_loss_weight": f.prior_loss_weight,
        "random_crop": f.random_crop,
        "reg_data_dir": f.reg_data_dir,
        "resolution": f.max_resolution,
        "resume": f.resume,
        "resume_from_huggingface": f.resume_from_huggingface,
        **_sample_and_save_keys(f),
        "scale_weight_norms": f.scale_weight_norms,
        "sdpa": True if f.xformers == "sdpa" else None,
        "seed": int(f.seed) if int(f.seed) != 0 else None,
        "shuffle_caption": f.shuffle_caption,
        "skip_cache_check": f.skip_cache_check,
        # stop_text_encoder_training: the LoRA tab says it is unsupported and passes none.
        "text_encoder_lr": te_list,
        "train_batch_size": f.train_batch_size,
        "train_data_dir": f.train_data_dir,
        "train_inpainting": inpaint,
        "training_comment": f.training_comment,
        "unet_lr": unet if unet != 0.0 else None,
        "log_with": f.log_with,
        "v2": f.v2 if not hy else None,
        "v_parameterization": f.v_parameterization,
        "v_pred_like_loss": _nz(f.v_pred_like_loss),
        "vae": f.anima_vae if an else f.hunyuan_vae if hy else f.vae,
        "vae_batch_size": _nz(f.vae_batch_size),
        "wandb_api_key": f.wandb_api_key,
        "wandb_run_name": f.wandb_run_name if f.wandb_run_name != "" else f.output_name,
        "weighted_captions": f.weighted_captions,
        "xformers": True if f.xformers == "xformers" else None,
        # SD3
        "clip_g": only_sd3(f.clip_g),
        "clip_g_dropout_rate": only_sd3(f.clip_g_dropout_rate),
        "clip_l_dropout_rate": only_sd3(f.sd3_clip_l_dropout_rate),
        "enable_scaled_pos_embed": only_sd3(f.sd3_enable_scaled_pos_embed),
        "logit_mean": only_sd3(f.logit_mean),
        "logit_std": only_sd3(f.logit_std),
        "mode_scale": only_sd3(f.mode_scale),
        "pos_emb_random_crop_rate": only_sd3(f.pos_emb_random_crop_rate),
        "save_clip": only_sd3(f.save_clip),
        "save_t5xxl": only_sd3(f.save_t5xxl),
        "t5_dropout_rate": only_sd3(f.sd3_t5_dropout_rate),
        "t5xxl_device": only_sd3(f.t5xxl_device),
        "t5xxl_dtype": only_sd3(f.t5xxl_dtype),
        "text_encoder_batch_size": only_sd3(f.sd3_text_encoder_batch_size),
        "weighting_scheme": only_sd3(f.weighting_scheme),
        # FLUX.1
        "model_type": "chroma" if chroma else None,
        "ae": f.lumina_ae if lu else only_flux(f.ae),
        "t5xxl": f.t5xxl if flux else f.sd3_t5xxl if sd3 else None,
        "split_mode": only_flux(f.split_mode),
        "t5xxl_max_token_length": int(f.t5xxl_max_token_length) if flux else None,
        "guidance_scale": float(f.guidance_scale) if flux else None,
        "mem_eff_save": only_flux(f.mem_eff_save),
        "apply_t5_attn_mask": only_flux(f.apply_t5_attn_mask),
        "cpu_offload_checkpointing": only_flux(f.cpu_offload_checkpointing),
        "blocks_to_swap": f.blocks_to_swap if flux or sd3 or dit else None,
        "single_blocks_to_swap": only_flux(f.single_blocks_to_swap),
        "double_blocks_to_swap": only_flux(f.double_blocks_to_swap),
        "show_timesteps": f.show_timesteps if (flux or sd3 or an or lu) and f.show_timesteps else None,
        "show_timesteps_resolution": f.show_timesteps_resolution if (flux or sd3 or an or lu) and f.show_timesteps
        else None,
        "discrete_flow_shift": float(f.lumina_discrete_flow_shift) if lu else float(f.anima_discrete_flow_shift)
        if an else float(f.hunyuan_discrete_flow_shift) if hy else float(f.discrete_flow_shift) if flux else None,
        "model_prediction_type": f.lumina_model_prediction_type if lu else f.hunyuan_model_prediction_type if hy
        else only_flux(f.model_prediction_type),
        "timestep_sampling": f.lumina_timestep_sampling if lu else f.anima_timestep_sampling if an
        else f.hunyuan_timestep_sampling if hy else only_flux(f.timestep_sampling),
        **_dit_keys(f, hy, an, lu),
    }
    c = _drop_unset_lora(c)
    c["max_data_loader_n_workers"] = int(f.max_data_loader_n_workers)
    if chroma:
        c["apply_t5_attn_mask"] = True
        c["guidance_scale"] = float(f.guidance_scale)
    return script, c


def _dit_keys(f: _Form, hy: bool, an: bool, lu: bool) -> dict[str, Any]:
    """The LoRA tab's keys for its HunyuanImage-2.1, Anima and Lumina checkboxes."""
    def i(v: Any) -> int:
        return int(v) if v not in ("", None) else 0

    return {
        "sigmoid_scale": float(f.lumina_sigmoid_scale) if lu else float(f.anima_sigmoid_scale) if an
        else float(f.hunyuan_sigmoid_scale) if hy else None,
        "attn_mode": f.anima_attn_mode if an and f.anima_attn_mode != "torch" else f.hunyuan_attn_mode if hy else None,
        "split_attn": f.anima_split_attn if an else f.hunyuan_split_attn if hy else None,
        "text_encoder": f.hunyuan_text_encoder if hy else None,
        "byt5": f.hunyuan_byt5 if hy else None,
        "fp8_scaled": f.hunyuan_fp8_scaled if hy else None,
        "fp8_vl": f.hunyuan_fp8_vl if hy else None,
        "text_encoder_cpu": f.hunyuan_text_encoder_cpu if hy else None,
        "vae_chunk_size": i(f.anima_vae_chunk_size) if an and f.anima_vae_chunk_size else
        i(f.hunyuan_vae_chunk_size) if hy and f.hunyuan_vae_chunk_size else None,
        "gemma2": f.lumina_gemma2 if lu else None,
        "gemma2_max_token_length": i(f.lumina_gemma2_max_token_length) if lu and f.lumina_gemma2_max_token_length
        else None,
        "system_prompt": f.lumina_system_prompt if lu and f.lumina_system_prompt else None,
        "use_flash_attn": f.lumina_use_flash_attn if lu else None,
        "use_sage_attn": f.lumina_use_sage_attn if lu else None,
        "qwen3": f.anima_qwen3 if an else None,
        "llm_adapter_path": f.anima_llm_adapter_path if an and f.anima_llm_adapter_path else None,
        "t5_tokenizer_path": f.anima_t5_tokenizer_path if an and f.anima_t5_tokenizer_path else None,
        "qwen3_max_token_length": i(f.anima_qwen3_max_token_length) if an else None,
        "t5_max_token_length": i(f.anima_t5_max_token_length) if an else None,
        "vae_disable_cache": f.anima_vae_disable_cache if an else None,
        "unsloth_offload_checkpointing": f.anima_unsloth_offload_checkpointing if an else None,
        "qwen_image_vae_2d": f.anima_qwen_image_vae_2d if an else None,
        "compile": f.anima_compile if an else None,
        "torch_compile": f.anima_torch_compile if an else None,
        "compile_backend": f.anima_compile_backend if an and f.anima_compile else None,
        "compile_mode": f.anima_compile_mode if an and f.anima_compile else None,
        "compile_dynamic": f.anima_compile_dynamic if an and f.anima_compile and f.anima_compile_dynamic != "auto"
        else None,
        "compile_fullgraph": f.anima_compile_fullgraph if an and f.anima_compile else None,
        "compile_cache_size_limit": i(f.anima_compile_cache_size_limit)
        if an and f.anima_compile and f.anima_compile_cache_size_limit else None,
    }


