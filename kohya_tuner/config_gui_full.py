"""The kohya_ss GUI's DreamBooth and Finetune tabs (dreambooth_gui / finetune_gui train_model) as
config_gui reads them: the full fine-tune TOML each tab writes (docs/kohya-gui.md)."""

from __future__ import annotations

import math
from typing import Any

from kohya_tuner.config_gui_form import _check_args_fields, _drop_unset_full, _Form, _gui_split, _nz, _sample_and_save_keys, _warmup


# ---- the DreamBooth and Finetune tabs (dreambooth_gui / finetune_gui train_model) -----------

def _full_common(f: _Form, sdxl: bool, flux: bool, sd3: bool) -> dict[str, Any]:
    """The keys the DreamBooth and Finetune tabs write alike."""
    return {
        "adaptive_noise_scale": _nz(f.adaptive_noise_scale),
        "async_upload": f.async_upload,
        "bucket_no_upscale": f.bucket_no_upscale,
        "bucket_reso_steps": f.bucket_reso_steps,
        "caption_dropout_every_n_epochs": int(f.caption_dropout_every_n_epochs),
        "caption_dropout_rate": f.caption_dropout_rate,
        "caption_extension": f.caption_extension,
        "clip_l": f.flux1_clip_l if flux else f.clip_l if sd3 else None,
        "clip_skip": _nz(f.clip_skip),
        "color_aug": f.color_aug,
        "dataset_config": f.dataset_config,
        "debiased_estimation_loss": f.debiased_estimation_loss,
        "disable_mmap_load_safetensors": f.disable_mmap_load_safetensors,
        "dynamo_backend": f.dynamo_backend,
        "flip_aug": f.flip_aug,
        "fp8_base": f.fp8_base,
        "full_bf16": f.full_bf16,
        "full_fp16": f.full_fp16,
        "fused_backward_pass": f.sd3_fused_backward_pass if sd3 else f.flux_fused_backward_pass if flux
        else f.fused_backward_pass,
        "fused_optimizer_groups": int(f.fused_optimizer_groups) if f.fused_optimizer_groups > 0 else None,
        "gradient_accumulation_steps": int(f.gradient_accumulation_steps),
        "gradient_checkpointing": f.gradient_checkpointing,
        "huber_c": f.huber_c,
        "huber_scale": f.huber_scale,
        "huber_schedule": f.huber_schedule,
        "huggingface_path_in_repo": f.huggingface_path_in_repo,
        "huggingface_repo_id": f.huggingface_repo_id,
        "huggingface_repo_type": f.huggingface_repo_type,
        "huggingface_repo_visibility": f.huggingface_repo_visibility,
        "huggingface_token": f.huggingface_token,
        "ip_noise_gamma": _nz(f.ip_noise_gamma),
        "ip_noise_gamma_random_strength": f.ip_noise_gamma_random_strength,
        "keep_tokens": int(f.keep_tokens),
        "learning_rate": f.learning_rate,
        "learning_rate_te": f.learning_rate_te if not sdxl else None,
        "learning_rate_te1": f.learning_rate_te1 if sdxl else None,
        "learning_rate_te2": f.learning_rate_te2 if sdxl else None,
        "logging_dir": f.logging_dir,
        "log_config": f.log_config,
        "log_tracker_config": f.log_tracker_config,
        "log_tracker_name": f.log_tracker_name,
        "log_with": f.log_with,
        "loss_type": f.loss_type,
        "lr_scheduler": f.lr_scheduler,
        "lr_scheduler_args": _gui_split(f.lr_scheduler_args),
        "lr_scheduler_type": f.lr_scheduler_type if f.lr_scheduler_type != "" else None,
        "lr_warmup_steps": _warmup(f.lr_warmup, f.lr_warmup_steps),
        "masked_loss": f.masked_loss,
        "max_timestep": _nz(f.max_timestep),
        "max_train_epochs": int(f.max_train_epochs) if int(f.max_train_epochs) != 0 else None,
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
        "multires_noise_discount": f.multires_noise_discount,
        "multires_noise_iterations": _nz(f.multires_noise_iterations),
        "no_half_vae": bool(sdxl and f.sdxl_no_half_vae),
        "noise_offset": _nz(f.noise_offset),
        "noise_offset_random_strength": f.noise_offset_random_strength,
        "noise_offset_type": f.noise_offset_type,
        "optimizer_type": f.optimizer,
        "output_dir": f.output_dir,
        "output_name": f.output_name,
        "persistent_data_loader_workers": int(f.persistent_data_loader_workers),
        "pretrained_model_name_or_path": f.pretrained_model_name_or_path,
        "random_crop": f.random_crop,
        "resolution": f.max_resolution,
        "resume": f.resume,
        "resume_from_huggingface": f.resume_from_huggingface,
        **_sample_and_save_keys(f),
        "sdpa": True if f.xformers == "sdpa" else None,
        "seed": int(f.seed) if int(f.seed) != 0 else None,
        "shuffle_caption": f.shuffle_caption,
        "skip_cache_check": f.skip_cache_check,
        "t5xxl": f.t5xxl if sd3 else f.flux1_t5xxl if flux else None,
        "train_batch_size": f.train_batch_size,
        "v2": f.v2,
        "v_parameterization": f.v_parameterization,
        "v_pred_like_loss": _nz(f.v_pred_like_loss),
        "vae_batch_size": _nz(f.vae_batch_size),
        "wandb_api_key": f.wandb_api_key,
        "wandb_run_name": f.wandb_run_name if f.wandb_run_name != "" else f.output_name,
        "weighted_captions": f.weighted_captions,
        "xformers": True if f.xformers == "xformers" else None,
        "clip_g": f.clip_g if sd3 else None,
        "logit_mean": f.logit_mean if sd3 else None,
        "logit_std": f.logit_std if sd3 else None,
        "mode_scale": f.mode_scale if sd3 else None,
        "save_clip": f.save_clip if sd3 else None,
        "save_t5xxl": f.save_t5xxl if sd3 else None,
        "t5xxl_device": f.t5xxl_device if sd3 else None,
        "t5xxl_dtype": f.t5xxl_dtype if sd3 else None,
        "text_encoder_batch_size": f.sd3_text_encoder_batch_size if sd3 else None,
        "weighting_scheme": f.weighting_scheme if sd3 else None,
        "ae": f.ae if flux else None,
        "t5xxl_max_token_length": f.t5xxl_max_token_length if flux else None,
        "guidance_scale": f.guidance_scale if flux else None,
        "blockwise_fused_optimizers": f.blockwise_fused_optimizers if flux else None,
        "cpu_offload_checkpointing": f.cpu_offload_checkpointing if flux else None,
        "single_blocks_to_swap": f.single_blocks_to_swap if flux else None,
        "double_blocks_to_swap": f.double_blocks_to_swap if flux else None,
        "show_timesteps": f.show_timesteps if (flux or sd3) and f.show_timesteps else None,
        "show_timesteps_resolution": f.show_timesteps_resolution if (flux or sd3) and f.show_timesteps else None,
        "mem_eff_save": f.mem_eff_save if flux else None,
        "apply_t5_attn_mask": f.apply_t5_attn_mask if flux else None,
    }


def _steps(value: Any) -> int:
    return 0 if value in ("", None) else int(value)


def _dreambooth_toml(f: _Form) -> tuple[str, dict[str, Any]]:
    _check_args_fields(f)
    sdxl, flux, sd3 = bool(f.sdxl), bool(f.flux1_checkbox), bool(f.sd3_checkbox)
    script = ("sdxl_train.py" if sdxl else "sd3_train.py" if sd3 else "flux_train.py" if flux else "train_db.py")
    inpaint = bool(f.train_inpainting) and not (sd3 or flux)
    te1, te2 = f.learning_rate_te1, f.learning_rate_te2
    c = _full_common(f, sdxl, flux, sd3)
    c.update({
        "cache_latents": f.cache_latents and not inpaint,
        "cache_latents_to_disk": f.cache_latents_to_disk and not inpaint,
        "cache_text_encoder_outputs": bool((sdxl and f.sdxl_cache_text_encoder_outputs) or (
            sd3 and f.sd3_cache_text_encoder_outputs) or (flux and f.flux1_cache_text_encoder_outputs)),
        "cache_text_encoder_outputs_to_disk": bool((sd3 and f.sd3_cache_text_encoder_outputs_to_disk) or (
            flux and f.flux1_cache_text_encoder_outputs_to_disk)),
        "enable_bucket": f.enable_bucket,
        "epoch": int(f.epoch),
        "lr_scheduler_num_cycles": int(f.lr_scheduler_num_cycles) if f.lr_scheduler_num_cycles != "" else int(f.epoch),
        "lr_scheduler_power": f.lr_scheduler_power,
        "max_bucket_reso": f.max_bucket_reso,
        "max_grad_norm": f.max_grad_norm,
        "max_token_length": int(f.max_token_length),
        "max_train_steps": _steps(f.max_train_steps) or None,
        "no_token_padding": f.no_token_padding,
        "optimizer_args": _gui_split(f.optimizer_args) if f.optimizer_args != "" else None,
        "prior_loss_weight": f.prior_loss_weight,
        "reg_data_dir": f.reg_data_dir,
        "stop_text_encoder_training": _nz(f.stop_text_encoder_training),
        "train_data_dir": f.train_data_dir,
        "train_inpainting": inpaint,
        "train_text_encoder": ((te1 is not None and te1 > 0) or (te2 is not None and te2 > 0)) if sdxl else None,
        "vae": f.vae,
        "discrete_flow_shift": f.discrete_flow_shift if flux else None,
        "model_prediction_type": f.model_prediction_type if flux else None,
        "timestep_sampling": f.timestep_sampling if flux else None,
        "blocks_to_swap": f.blocks_to_swap if flux or sd3 else None,
    })
    c = _drop_unset_full(c)
    c["max_data_loader_n_workers"] = _steps(f.max_data_loader_n_workers)
    return script, c


def _finetune_toml(f: _Form) -> tuple[str, dict[str, Any]]:
    _check_args_fields(f)
    sdxl, flux, sd3 = bool(f.sdxl_checkbox), bool(f.flux1_checkbox), bool(f.sd3_checkbox)
    script = ("sdxl_train.py" if sdxl else "sd3_train.py" if sd3 else "flux_train.py" if flux else "fine_tune.py")
    inpaint = bool(f.train_inpainting) and not (sd3 or flux)
    max_train_steps = f.max_train_steps
    if not f.dataset_config:
        # The GUI counts the images in image_folder here (none are counted from a file alone),
        # and halves the steps when flip_aug doubles the images.
        if f.flip_aug and max_train_steps:
            max_train_steps = int(math.ceil(float(max_train_steps) / 2))
    train_dir = f.train_dir
    in_json = f"{train_dir}/{f.latent_metadata_filename if f.use_latent_files == 'Yes' else f.caption_metadata_filename}"
    c = _full_common(f, sdxl, flux, sd3)
    c.update({
        "block_lr": f.block_lr,
        "cache_latents": f.cache_latents and not inpaint,
        "cache_latents_to_disk": f.cache_latents_to_disk and not inpaint,
        "cache_text_encoder_outputs": bool((sdxl and f.sdxl_cache_text_encoder_outputs) or (
            sd3 and f.sd3_cache_text_encoder_outputs) or (flux and f.flux1_cache_text_encoder_outputs)),
        "cache_text_encoder_outputs_to_disk": bool((sd3 and f.sd3_cache_text_encoder_outputs_to_disk) or (
            flux and f.flux1_cache_text_encoder_outputs_to_disk)),
        "dataset_repeats": int(f.dataset_repeats),
        "enable_bucket": True,
        "in_json": in_json,
        "max_bucket_reso": int(f.max_bucket_reso),
        "max_token_length": int(f.max_token_length),
        "max_train_steps": _steps(max_train_steps) or None,
        "optimizer_args": _gui_split(f.optimizer_args),
        "train_data_dir": f.image_folder,
        "train_inpainting": inpaint,
        "train_text_encoder": f.train_text_encoder,
        "vae": None,
        "discrete_flow_shift": f.discrete_flow_shift if flux else None,
        "model_prediction_type": f.model_prediction_type if flux else None,
        "timestep_sampling": f.timestep_sampling if flux else None,
        "blocks_to_swap": f.blocks_to_swap if flux else None,
    })
    c = _drop_unset_full(c)
    c["max_data_loader_n_workers"] = _steps(f.max_data_loader_n_workers)
    return script, c


