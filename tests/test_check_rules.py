"""One test per start-up rule in kohya_tuner/check/rules.toml.

Each example is a config (and dataset file) that breaks the rule and the smallest change
that satisfies it; the test id names the rule and the source line at the pinned
sd-scripts commit where it is enforced, e.g. `full_fp16_needs_fp16@train_network.py:817`.
"""

from __future__ import annotations

import pytest

from kohya_tuner.check import engine

SD, XL, FX, S3 = "train_network.py", "sdxl_train_network.py", "flux_train_network.py", "sd3_train_network.py"
LU, HY, AN = "lumina_train_network.py", "hunyuan_image_train_network.py", "anima_train_network.py"
DB, FT, XLF, FXF, S3F = "train_db.py", "fine_tune.py", "sdxl_train.py", "flux_train.py", "sd3_train.py"

BASE = {
    SD: {"pretrained_model_name_or_path": "m.safetensors", "network_module": "networks.lora", "resolution": "512", "network_dim": 8},
    XL: {"pretrained_model_name_or_path": "m.safetensors", "network_module": "networks.lora", "resolution": "1024", "network_dim": 8},
    FX: {"pretrained_model_name_or_path": "m.safetensors", "network_module": "networks.lora_flux",
         "resolution": "512", "network_dim": 8},
    S3: {"pretrained_model_name_or_path": "m.safetensors", "network_module": "networks.lora_sd3",
         "resolution": "1024", "network_dim": 8, "clip_l": "l.safetensors", "clip_g": "g.safetensors",
         "t5xxl": "t5.safetensors"},
    LU: {"pretrained_model_name_or_path": "m.safetensors", "network_module": "networks.lora_lumina",
         "resolution": "1024", "network_dim": 8},
    HY: {"pretrained_model_name_or_path": "m.safetensors", "network_module": "networks.lora_hunyuan_image",
         "resolution": "1024", "network_dim": 8},
    AN: {"pretrained_model_name_or_path": "m.safetensors", "network_module": "networks.lora_anima",
         "resolution": "1024", "network_dim": 8},
    **{full: {"pretrained_model_name_or_path": "m.safetensors", "resolution": "1024"} for full in (DB, FT, XLF, FXF, S3F)},
}


def ds(general=None, **subset):
    return {"general": general or {}, "datasets": [{"subsets": [{"image_dir": "img", **subset}]}]}


# rule id -> (script, breaking config, satisfying config, dataset for both or None)
EXAMPLES = {
    "adaptive_noise_scale_needs_noise_offset": (SD, {"adaptive_noise_scale": 0.1}, {"adaptive_noise_scale": 0.1, "noise_offset": 0.05}, None),
    "scale_v_pred_loss_needs_v_parameterization": (SD, {"scale_v_pred_loss_like_noise_pred": True}, {"scale_v_pred_loss_like_noise_pred": True, "v_parameterization": True}, None),
    "v_pred_like_loss_excludes_v_parameterization": (SD, {"v_pred_like_loss": 0.1, "v_parameterization": True}, {"v_pred_like_loss": 0.1}, None),
    "cache_latents_to_disk_turns_on_cache_latents": (SD, {"cache_latents_to_disk": True}, {"cache_latents_to_disk": True, "cache_latents": True}, None),
    "v2_with_clip_skip": (SD, {"v2": True, "clip_skip": 2}, {"v2": True}, None),
    "zero_terminal_snr_without_v_parameterization": (SD, {"zero_terminal_snr": True}, {"zero_terminal_snr": True, "v_parameterization": True}, None),
    "sample_every_n_epochs_not_positive": (SD, {"sample_every_n_epochs": 0}, {"sample_every_n_epochs": 1}, None),
    "sample_every_n_steps_not_positive": (SD, {"sample_every_n_steps": -5}, {"sample_every_n_steps": 5}, None),
    "caption_extention_spelling": (SD, {"caption_extention": ".txt"}, {"caption_extension": ".txt"}, None),
    "resolution_one_or_two_sides": (SD, {"resolution": "512,512,512"}, {"resolution": "512,512"}, None),
    "face_crop_aug_range_two_floats": (SD, {"face_crop_aug_range": "2.0,1.0"}, {"face_crop_aug_range": "1.0,2.0"}, None),
    "in_json_latents_ignored_with_augmentation": (SD, {"in_json": "meta.json", "color_aug": True}, {"in_json": "meta.json"}, None),
    "use_8bit_adam_and_use_lion_optimizer": (SD, {"use_8bit_adam": True, "use_lion_optimizer": True}, {"use_8bit_adam": True}, None),
    "use_8bit_adam_and_optimizer_type": (SD, {"use_8bit_adam": True, "optimizer_type": "AdamW"}, {"use_8bit_adam": True}, None),
    "use_lion_optimizer_and_optimizer_type": (SD, {"use_lion_optimizer": True, "optimizer_type": "AdamW"}, {"use_lion_optimizer": True}, None),
    "fused_backward_pass_needs_adafactor": (SD, {"fused_backward_pass": True, "optimizer_type": "AdamW"}, {"fused_backward_pass": True, "optimizer_type": "adafactor"}, None),
    "fused_backward_pass_needs_no_accumulation": (SD, {"fused_backward_pass": True, "optimizer_type": "Adafactor", "gradient_accumulation_steps": 2}, {"fused_backward_pass": True, "optimizer_type": "Adafactor"}, None),
    "optimizer_args_key_value": (SD, {"optimizer_args": ["betas=0.9,0.99=x"]}, {"optimizer_args": ["betas=0.9,0.99"]}, None),
    "optimizer_args_python_literal": (SD, {"optimizer_args": ["weight_decay=small"]}, {"optimizer_args": ["weight_decay=0.01"]}, None),
    "optimizer_type_unknown": (SD, {"optimizer_type": "AdEMAMix8bit"}, {"optimizer_type": "AdamW8bit"}, None),
    "sgd_nesterov_momentum_default": (SD, {"optimizer_type": "SGDNesterov"}, {"optimizer_type": "SGDNesterov", "optimizer_args": ["momentum=0.8"]}, None),
    "dadapt_prodigy_small_learning_rate": (SD, {"optimizer_type": "Prodigy", "learning_rate": 1e-4}, {"optimizer_type": "Prodigy", "learning_rate": 1.0}, None),
    "adafactor_relative_step_takes_over_lr": (SD, {"optimizer_type": "Adafactor"}, {"optimizer_type": "Adafactor", "optimizer_args": ["relative_step=False"]}, None),
    "lr_scheduler_args_key_value": (SD, {"lr_scheduler_args": ["T_max"]}, {"lr_scheduler_args": ["T_max=10"]}, None),
    "lr_scheduler_args_python_literal": (SD, {"lr_scheduler_args": ["gamma=fast"]}, {"lr_scheduler_args": ["gamma=0.5"]}, None),
    "scheduler_without_warmup": (SD, {"lr_warmup_steps": 10}, {"lr_warmup_steps": 10, "lr_scheduler": "constant_with_warmup"}, None),
    "adafactor_scheduler_needs_adafactor": (SD, {"lr_scheduler": "adafactor"}, {"lr_scheduler": "adafactor", "optimizer_type": "Adafactor"}, None),
    "adafactor_scheduler_needs_relative_step": (SD, {"lr_scheduler": "adafactor", "optimizer_type": "Adafactor", "optimizer_args": ["relative_step=False"]}, {"lr_scheduler": "adafactor", "optimizer_type": "Adafactor"}, None),
    "lr_scheduler_unknown": (SD, {"lr_scheduler": "cosine_annealing"}, {"lr_scheduler": "cosine"}, None),
    "lr_scheduler_broken_at_pin": (SD, {"lr_scheduler": "reduce_lr_on_plateau"}, {"lr_scheduler": "warmup_stable_decay"}, None),
    "cosine_with_min_lr_needs_ratio": (SD, {"lr_scheduler": "cosine_with_min_lr"}, {"lr_scheduler": "cosine_with_min_lr", "lr_scheduler_min_lr_ratio": 0.1}, None),
    "piecewise_constant_needs_step_rules": (SD, {"lr_scheduler": "piecewise_constant"}, {"lr_scheduler": "piecewise_constant", "lr_scheduler_args": ["step_rules='1:10,0.1'"]}, None),
    "tensorboard_needs_logging_dir": (SD, {"log_with": "tensorboard"}, {"log_with": "tensorboard", "logging_dir": "logs"}, None),
    "logging_dir_turns_on_tensorboard": (SD, {"logging_dir": "logs"}, {"logging_dir": "logs", "log_with": "tensorboard"}, None),
    "bucket_reso_steps_multiple_of_32": (
        {"general": {"enable_bucket": True, "bucket_reso_steps": 48}, "datasets": [{"subsets": [{"image_dir": "a"}]}]},
        {"general": {"enable_bucket": True, "bucket_reso_steps": 48},
         "datasets": [{"bucket_reso_steps": 64, "subsets": [{"image_dir": "a"}]}]}),
    "resolution_required": (SD, {"resolution": None}, {"resolution": None}, ds({"resolution": 512})),
    "min_bucket_reso_above_resolution": (SD, {"resolution": "64,64", "enable_bucket": True}, {"resolution": "64,64", "enable_bucket": True, "min_bucket_reso": 64}, None),
    "max_bucket_reso_below_resolution": (SD, {"resolution": "1024", "enable_bucket": True, "max_bucket_reso": 768}, {"resolution": "768", "enable_bucket": True, "max_bucket_reso": 768}, None),
    "min_bucket_reso_rounded_down": (SD, {"enable_bucket": True, "min_bucket_reso": 300}, {"enable_bucket": True, "min_bucket_reso": 320}, None),
    "max_bucket_reso_rounded_up": (SD, {"enable_bucket": True, "max_bucket_reso": 1000}, {"enable_bucket": True, "max_bucket_reso": 1024}, None),
    "bucket_no_upscale_ignores_bucket_limits": (SD, {"enable_bucket": True, "bucket_no_upscale": True}, {"enable_bucket": True}, None),
    "bucket_reso_steps_multiple_of_64": (FX, {"enable_bucket": True, "bucket_reso_steps": 32}, {"enable_bucket": True, "bucket_reso_steps": 64}, None),
    "bucket_reso_steps_multiple_of_32": (XL, {}, {}, None),
    # The kohya_ss GUI ships presets with bucket_reso_steps = 1; without buckets sd-scripts never looks at it.
    "sd3_bucket_reso_steps_multiple_of_32": (S3, {"enable_bucket": True, "bucket_reso_steps": 1}, {"enable_bucket": False, "bucket_reso_steps": 1}, None),
    "full_bucket_reso_steps_multiple_of_64": (DB, {"enable_bucket": True, "bucket_reso_steps": 1}, {"enable_bucket": False, "bucket_reso_steps": 1}, None),
    "sdxl_full_bucket_reso_steps_multiple_of_32": (XLF, {"enable_bucket": True, "bucket_reso_steps": 48}, {"enable_bucket": True, "bucket_reso_steps": 32}, None),
    "flux_full_bucket_reso_steps_multiple_of_16": (FXF, {"enable_bucket": True, "bucket_reso_steps": 8}, {"enable_bucket": True, "bucket_reso_steps": 16}, None),
    "sd3_full_bucket_reso_steps_multiple_of_8": (S3F, {"enable_bucket": True, "bucket_reso_steps": 4}, {"enable_bucket": True, "bucket_reso_steps": 8}, None),
    "fixed_resolution_multiple_of_32": (XL, {"resolution": "1000"}, {"resolution": "1024"}, None),
    "fixed_resolution_multiple_of_16": (FX, {"resolution": "520"}, {"resolution": "528"}, None),
    "dreambooth_and_finetuning_subsets_mixed": (SD, {}, {}, None),
    "dataset_config_format": (SD, {"dataset_config": "dataset.yaml"}, {"dataset_config": "dataset.toml"}, None),
    "cache_latents_with_augmentation": (SD, {"cache_latents": True}, {"cache_latents": True}, None),
    "dataset_config_overrides_folders": (SD, {"dataset_config": "d.toml", "train_data_dir": "img"}, {"dataset_config": "d.toml"}, None),
    "debug_dataset_does_not_train": (SD, {"debug_dataset": True}, {"debug_dataset": False}, None),
    "network_dim_default": (SD, {"network_dim": None}, {"network_dim": 8}, None),
    "initial_step_overrides_resumed_step": (SD, {"resume": "state", "initial_step": 0}, {"resume": "state"}, None),
    "pretrained_model_required": (SD, {"pretrained_model_name_or_path": None}, {}, None),
    "network_module_required": (SD, {"network_module": None}, {}, None),
    "network_args_key_value": (SD, {"network_args": ["conv_dim"]}, {"network_args": ["conv_dim=4"]}, None),
    "dim_from_weights_needs_network_weights": (SD, {"dim_from_weights": True}, {"dim_from_weights": True, "network_weights": "w.safetensors"}, None),
    "nothing_to_train": (SD, {"network_train_unet_only": True, "network_train_text_encoder_only": True}, {"network_train_unet_only": True}, None),
    "cpu_offload_checkpointing_unet": (XL, {"gradient_checkpointing": True, "cpu_offload_checkpointing": True}, {"gradient_checkpointing": True}, None),
    "persistent_workers_need_workers": (SD, {"persistent_data_loader_workers": True, "max_data_loader_n_workers": 0}, {"persistent_data_loader_workers": True, "max_data_loader_n_workers": 1}, None),
    "max_train_epochs_overrides_steps": (SD, {"max_train_epochs": 3}, {"max_train_steps": 300}, None),
    "full_fp16_needs_fp16": (SD, {"full_fp16": True, "mixed_precision": "bf16"}, {"full_fp16": True, "mixed_precision": "fp16"}, None),
    "full_bf16_needs_bf16": (SD, {"full_bf16": True, "mixed_precision": "fp16"}, {"full_bf16": True, "mixed_precision": "bf16"}, None),
    "fp8_base_needs_mixed_precision": (FX, {"fp8_base_unet": True}, {"fp8_base_unet": True, "mixed_precision": "bf16"}, None),
    "initial_step_reaches_max_train_steps": (SD, {"initial_step": 100, "max_train_steps": 100}, {"initial_step": 99, "max_train_steps": 100}, None),
    "network_module_for_other_model": (FX, {"network_module": "networks.lora"}, {"network_module": "networks.lora_flux"}, None),
    "network_module_for_other_model_text_encoders_only": (XL, {"network_module": "networks.lora_sd3"}, {"network_module": "networks.lora"}, None),
    "lora_network_args_integers": (FX, {"network_args": ["img_attn_dim=8.5"]}, {"network_args": ["img_attn_dim=8"]}, None),
    "lora_network_args_numbers": (SD, {"network_args": ["conv_dim=4", "conv_alpha=half"]}, {"network_args": ["conv_dim=4", "conv_alpha=0.5"]}, None),
    "lora_block_dims_count_sd": (SD, {"network_args": ["block_dims=" + ",".join(["4"] * 23)]}, {"network_args": ["block_dims=" + ",".join(["4"] * 25)]}, None),
    "lora_block_dims_count_sdxl": (XL, {"network_args": ["block_dims=" + ",".join(["4"] * 25)]}, {"network_args": ["block_dims=" + ",".join(["4"] * 23)]}, None),
    "lora_flux_in_dims_count": (FX, {"network_args": ["in_dims=4,4,4"]}, {"network_args": ["in_dims=4,4,4,4,4"]}, None),
    "lora_flux_train_blocks_choice": (FX, {"network_args": ["train_blocks=double_only"]}, {"network_args": ["train_blocks=double"]}, None),
    "sdxl_v2": (XL, {"v2": True}, {"v2": False}, None),
    "sdxl_clip_skip": (XL, {"clip_skip": 2}, {}, None),
    "network_module_is_stdlib": (SD, {"network_module": "os.system"}, {"network_module": "lycoris.kohya"}, None),
    "clip_skip_beyond_sd1_text_encoder": (SD, {"clip_skip": 100}, {"clip_skip": 13}, None),
    "clip_skip_beyond_sd2_text_encoder": (SD, {"v2": True, "clip_skip": 25}, {"v2": True, "clip_skip": 24}, None),
    "sdxl_te_cache_to_disk_turns_on_cache": (XL, {"cache_text_encoder_outputs_to_disk": True, "network_train_unet_only": True}, {"cache_text_encoder_outputs_to_disk": True, "cache_text_encoder_outputs": True, "network_train_unet_only": True}, None),
    "sdxl_te_cache_with_caption_changes": (XL, {"cache_text_encoder_outputs": True, "network_train_unet_only": True}, {"cache_text_encoder_outputs": True, "network_train_unet_only": True}, None),
    "sdxl_te_cache_needs_unet_only": (XL, {"cache_text_encoder_outputs_to_disk": True}, {"cache_text_encoder_outputs_to_disk": True, "network_train_unet_only": True}, None),
    "flux_chroma_needs_t5_attn_mask": (FX, {"model_type": "chroma"}, {"model_type": "chroma", "apply_t5_attn_mask": True}, None),
    "flux_fp8_base_unet_turns_on_fp8_base": (FX, {"fp8_base_unet": True, "mixed_precision": "bf16"}, {"fp8_base_unet": True, "fp8_base": True, "mixed_precision": "bf16"}, None),
    "flux_te_cache_to_disk_turns_on_cache": (FX, {"cache_text_encoder_outputs_to_disk": True}, {"cache_text_encoder_outputs_to_disk": True, "cache_text_encoder_outputs": True}, None),
    "flux_te_cache_with_caption_changes": (FX, {"cache_text_encoder_outputs": True, "caption_dropout_rate": 0.1}, {"cache_text_encoder_outputs": True}, None),
    "flux_max_token_length_unused": (FX, {"max_token_length": 225}, {}, None),
    "flux_blocks_to_swap_with_cpu_offload": (FX, {"blocks_to_swap": 8, "cpu_offload_checkpointing": True}, {"blocks_to_swap": 8}, None),
    "flux_split_mode_ignored": (FX, {"split_mode": True, "blocks_to_swap": 8}, {"blocks_to_swap": 8}, None),
    "flux_split_mode_becomes_block_swap": (FX, {"split_mode": True}, {"blocks_to_swap": 18}, None),
    "flux_blocks_to_swap_max": (FX, {"blocks_to_swap": 36}, {"blocks_to_swap": 35}, None),
    "flux_te_cache_with_t5_training": (FX, {"cache_text_encoder_outputs": True, "network_args": ["train_t5xxl=True"]}, {"cache_text_encoder_outputs": True, "network_args": ["train_t5xxl=False"]}, None),
    "sd3_fp8_base_unet_turns_on_fp8_base": (S3, {"fp8_base_unet": True, "mixed_precision": "bf16"}, {"fp8_base_unet": True, "fp8_base": True, "mixed_precision": "bf16"}, None),
    "sd3_te_cache_to_disk_turns_on_cache": (S3, {"cache_text_encoder_outputs_to_disk": True}, {"cache_text_encoder_outputs_to_disk": True, "cache_text_encoder_outputs": True}, None),
    "sd3_te_cache_with_caption_changes": (S3, {"cache_text_encoder_outputs": True, "token_warmup_step": 0.5}, {"cache_text_encoder_outputs": True}, None),
    "sd3_max_token_length_unused": (S3, {"max_token_length": 150}, {}, None),
    "sd3_blocks_to_swap_with_cpu_offload": (S3, {"blocks_to_swap": 4, "cpu_offload_checkpointing": True}, {"cpu_offload_checkpointing": True}, None),
    "sd3_blocks_to_swap_max": (S3, {"blocks_to_swap": 23}, {"blocks_to_swap": 22}, None),
    "model_files_required": (S3, {"clip_g": None}, {}, None),
    "sd3_te_cache_with_t5_training": (S3, {"cache_text_encoder_outputs": True, "network_args": ["train_t5xxl=True"]}, {"network_args": ["train_t5xxl=True"]}, None),
    # Outside argparse's choices in a --config_file, refused by the code that reads them.
    "nothing_with_a_learning_rate": (SD, {"learning_rate": 0.0}, {"learning_rate": 0.0, "unet_lr": 0.0001}, None),
    # With max_train_epochs the step count comes from the dataset: a fraction may or may not reach a step.
    "scheduler_warmup_fraction_of_epochs": (SD, {"lr_scheduler": "constant", "lr_warmup_steps": 0.1, "max_train_epochs": 1, "max_train_steps": 100}, {"lr_scheduler": "constant_with_warmup", "lr_warmup_steps": 0.1, "max_train_epochs": 1}, None),
    "network_module_unimportable": (SD, {"network_module": "networks.lora_xl"}, {"network_module": "lycoris.kohya"}, None),
    "lycoris_boft_unsplittable": (S3, {"network_module": "lycoris.kohya", "network_args": ["algo=boft"], "network_dim": 32},
                                  {"network_module": "lycoris.kohya", "network_args": ["algo=boft"], "network_dim": 128}, None),
    # initial_epoch N starts at (N - 1) epochs of at least one step each.
    "initial_epoch_reaches_max_train_steps": (SD, {"initial_epoch": 4, "max_train_steps": 3}, {"initial_epoch": 4, "max_train_steps": 4}, None),
    "initial_epoch_reaches_max_train_epochs": (SD, {"initial_epoch": 2, "max_train_epochs": 1}, {"initial_epoch": 2, "max_train_epochs": 2}, None),
    "mixed_precision_unknown": (SD, {"mixed_precision": "fp32"}, {"mixed_precision": "fp8"}, None),
    "console_log_level_unknown": (SD, {"console_log_level": "info"}, {"console_log_level": "WARN"}, None),
    "log_with_unknown": (SD, {"log_with": "neptune", "logging_dir": "logs"}, {"log_with": "mlflow"}, None),
    "loss_type_unknown": (SD, {"loss_type": "mse"}, {"loss_type": "smooth_l1"}, None),
    "huber_schedule_unknown": (SD, {"loss_type": "huber", "huber_schedule": "linear"}, {"loss_type": "l2", "huber_schedule": "linear"}, None),
    "dynamo_backend_unknown": (SD, {"torch_compile": True, "dynamo_backend": "fast"}, {"torch_compile": True, "dynamo_backend": "no"}, None),
    "resize_interpolation_unknown": (SD, {"resize_interpolation": "sinc"}, {"resize_interpolation": "box"}, None),
    # load_flow_model compares model_type exactly: "Chroma" is refused, not trained as FLUX.1.
    "model_type_unknown": (FX, {"model_type": "Chroma", "apply_t5_attn_mask": True}, {"model_type": "chroma", "apply_t5_attn_mask": True}, None),
    # lumina_train_network.py, hunyuan_image_train_network.py, anima_train_network.py
    "lumina_te_cache_to_disk_turns_on_cache": (LU, {"cache_text_encoder_outputs_to_disk": True}, {"cache_text_encoder_outputs_to_disk": True, "cache_text_encoder_outputs": True}, None),
    "lumina_blocks_to_swap_max": (LU, {"blocks_to_swap": 25}, {"blocks_to_swap": 24}, None),
    "hunyuan_fp16_warning": (HY, {"mixed_precision": "fp16"}, {"mixed_precision": "bf16"}, None),
    "hunyuan_fp8_base_unsupported": (HY, {"fp8_base": True, "mixed_precision": "bf16"}, {"fp8_scaled": True, "mixed_precision": "bf16"}, None),
    "hunyuan_fp8_scaled_ignores_fp8_base": (HY, {"fp8_scaled": True, "fp8_base": True, "mixed_precision": "bf16"}, {"fp8_scaled": True, "mixed_precision": "bf16"}, None),
    "hunyuan_te_cache_to_disk_turns_on_cache": (HY, {"cache_text_encoder_outputs_to_disk": True}, {"cache_text_encoder_outputs_to_disk": True, "cache_text_encoder_outputs": True}, None),
    "hunyuan_te_cache_with_caption_changes": (HY, {"cache_text_encoder_outputs": True, "caption_dropout_rate": 0.1}, {"cache_text_encoder_outputs": True}, None),
    "hunyuan_blocks_to_swap_max": (HY, {"blocks_to_swap": 38}, {"blocks_to_swap": 37}, None),
    "anima_fp8_turned_off": (AN, {"fp8_base": True, "mixed_precision": "bf16"}, {"mixed_precision": "bf16"}, None),
    "anima_te_cache_to_disk_turns_on_cache": (AN, {"cache_text_encoder_outputs_to_disk": True, "network_train_unet_only": True}, {"cache_text_encoder_outputs_to_disk": True, "cache_text_encoder_outputs": True, "network_train_unet_only": True}, None),
    # caption_dropout_rate alone is allowed for Anima (cache_supports_dropout=True, library/train_util.py:1106).
    "anima_te_cache_with_caption_changes": (AN, {"cache_text_encoder_outputs": True, "network_train_unet_only": True, "shuffle_caption": True}, {"cache_text_encoder_outputs": True, "network_train_unet_only": True, "caption_dropout_rate": 0.1}, None),
    "anima_te_cache_needs_unet_only": (AN, {"cache_text_encoder_outputs": True}, {"cache_text_encoder_outputs": True, "network_train_unet_only": True}, None),
    "anima_blocks_to_swap_with_cpu_offload": (AN, {"blocks_to_swap": 8, "cpu_offload_checkpointing": True, "gradient_checkpointing": True}, {"blocks_to_swap": 8, "gradient_checkpointing": True}, None),
    "anima_unsloth_turns_on_checkpointing": (AN, {"unsloth_offload_checkpointing": True}, {"unsloth_offload_checkpointing": True, "gradient_checkpointing": True}, None),
    "anima_unsloth_with_cpu_offload": (AN, {"unsloth_offload_checkpointing": True, "cpu_offload_checkpointing": True, "gradient_checkpointing": True}, {"unsloth_offload_checkpointing": True, "gradient_checkpointing": True}, None),
    "anima_unsloth_with_blocks_to_swap": (AN, {"unsloth_offload_checkpointing": True, "blocks_to_swap": 4, "gradient_checkpointing": True}, {"unsloth_offload_checkpointing": True, "gradient_checkpointing": True}, None),
    "anima_bucket_reso_steps_multiple_of_16": (AN, {"enable_bucket": True, "bucket_reso_steps": 24}, {"enable_bucket": True, "bucket_reso_steps": 32}, None),
    "anima_blocks_to_swap_max": (AN, {"blocks_to_swap": 27}, {"blocks_to_swap": 26}, None),
}

# Rules that look at the dataset file: the breaking and the satisfying dataset differ.
DATASET_PAIRS = {
    "dreambooth_and_finetuning_subsets_mixed": (
        {"datasets": [{"subsets": [{"image_dir": "a"}, {"image_dir": "b", "metadata_file": "m.json"}]}]},
        {"datasets": [{"subsets": [{"image_dir": "a"}]}, {"subsets": [{"image_dir": "b", "metadata_file": "m.json"}]}]}),
    "cache_latents_with_augmentation": (ds(random_crop=True), ds(flip_aug=True)),
    "sdxl_te_cache_with_caption_changes": (ds({"shuffle_caption": True}), ds({"shuffle_caption": False})),
    "bucket_reso_steps_multiple_of_32": (
        {"general": {"enable_bucket": True, "bucket_reso_steps": 48}, "datasets": [{"subsets": [{"image_dir": "a"}]}]},
        {"general": {"enable_bucket": True, "bucket_reso_steps": 48},
         "datasets": [{"bucket_reso_steps": 64, "subsets": [{"image_dir": "a"}]}]}),
    "resolution_required": ({"datasets": [{"subsets": [{"image_dir": "img"}]}]}, ds({"resolution": 512})),
}


def _line(rule_id: str) -> str:
    return next(r.line for r in engine.rules() if r.id == rule_id)


# Rules on the model's own layers need the family (the script alone trains several).
EXAMPLE_FAMILY = {"lycoris_boft_unsplittable": "sd35l", "sd3_blocks_to_swap_max": "sd3"}


def _fires(rule_id, script, config, dataset, **kw):
    kw.setdefault("family", EXAMPLE_FAMILY.get(rule_id))
    res = engine.check({**BASE[script], **config}, script, dataset=dataset, complete=True, **kw)
    return [p for p in res.problems + res.warnings if p.rule == rule_id], res


@pytest.mark.parametrize("rule_id", sorted(EXAMPLES), ids=lambda r: f"{r}@{_line(r)}")
def test_rule_fires_on_its_example_and_not_on_the_fix(rule_id):
    script, bad, good, dataset = EXAMPLES[rule_id]
    bad_ds, good_ds = DATASET_PAIRS.get(rule_id, (dataset, dataset))
    bad = {k: v for k, v in bad.items()}
    found, res = _fires(rule_id, script, {k: v for k, v in bad.items() if v is not None}, bad_ds)
    if any(v is None for v in bad.values()):  # a required key removed
        cfg = {k: v for k, v in {**BASE[script], **bad}.items() if v is not None}
        res = engine.check(cfg, script, dataset=bad_ds, complete=True)
        found = [p for p in res.problems + res.warnings if p.rule == rule_id]
    rule = next(r for r in engine.rules() if r.id == rule_id)
    assert len(found) == 1, (rule_id, res.problems, res.warnings)
    assert found[0].severity == engine.SEVERITY[rule.severity]
    assert found[0].where == rule.where and found[0].keys == rule.keys
    assert "{" not in found[0].message, found[0].message
    good_found, res = _fires(rule_id, script, {k: v for k, v in good.items() if v is not None}, good_ds)
    assert good_found == [], (rule_id, good_found)
    # A problem makes the whole check fail; a warning alone does not.
    if rule.severity == "problem":
        assert not engine.check({**BASE[script], **{k: v for k, v in bad.items() if v is not None}}, script,
                                dataset=bad_ds, complete=True, family=EXAMPLE_FAMILY.get(rule_id)).ok \
            or any(v is None for v in bad.values())


FILE_RULES = ("dataset_config_missing", "no_training_images", "subset_image_dir_missing", "caption_file_empty",
              "pretrained_model_missing", "network_weights_missing", "resume_state_missing", "vae_missing",
              "fixed_resolution_image_too_large", "fixed_resolution_image_too_small", "image_side_below_bucket_step")


def _tree(tmp_path):
    img = tmp_path / "img" / "2_ohwx"
    img.mkdir(parents=True)
    (img / "a.png").write_bytes(b"\x89PNG")
    (img / "a.txt").write_text("ohwx\n")
    (tmp_path / "m.safetensors").write_bytes(b"0")
    (tmp_path / "w.safetensors").write_bytes(b"0")
    (tmp_path / "state").mkdir()
    (tmp_path / "ds.toml").write_text("")
    return {"pretrained_model_name_or_path": str(tmp_path / "m.safetensors"), "network_module": "networks.lora",
            "resolution": "512", "train_data_dir": str(tmp_path / "img")}


def _file_case(rule_id, tmp_path):
    """(config, dataset) breaking the rule, and the fixed pair, on a real folder tree."""
    base = _tree(tmp_path)
    sub = str(tmp_path / "img" / "2_ohwx")
    if rule_id == "dataset_config_missing":
        return ({**base, "dataset_config": str(tmp_path / "nope.toml")}, None), ({**base, "dataset_config": str(tmp_path / "ds.toml")}, None)
    if rule_id == "no_training_images":
        empty = tmp_path / "empty"
        (empty / "3_x").mkdir(parents=True)
        return ({**base, "train_data_dir": str(empty)}, None), (base, None)
    if rule_id == "subset_image_dir_missing":
        return (base, ds(image_dir=str(tmp_path / "gone"))), (base, ds(image_dir=sub))
    if rule_id == "caption_file_empty":
        (tmp_path / "img" / "2_ohwx" / "b.png").write_bytes(b"\x89PNG")
        (tmp_path / "img" / "2_ohwx" / "b.txt").write_text("")
        return (base, ds(image_dir=sub, caption_extension=".txt")), (base, ds(image_dir=sub, caption_extension=".cap"))
    if rule_id == "pretrained_model_missing":
        return ({**base, "pretrained_model_name_or_path": str(tmp_path / "gone.safetensors")}, None), ({**base, "pretrained_model_name_or_path": "runwayml/stable-diffusion-v1-5"}, None)
    if rule_id == "network_weights_missing":
        return ({**base, "network_weights": str(tmp_path / "gone.safetensors")}, None), ({**base, "network_weights": str(tmp_path / "w.safetensors")}, None)
    if rule_id in ("fixed_resolution_image_too_large", "fixed_resolution_image_too_small"):
        from PIL import Image

        Image.new("RGB", (96, 64)).save(tmp_path / "img" / "2_ohwx" / "a.png")
        fixed = {**base, "enable_bucket": False, "resolution": "64,64"}
        if rule_id.endswith("large"):
            return (fixed, None), ({**fixed, "random_crop": True}, None)
        return ({**fixed, "resolution": "96,96"}, None), ({**fixed, "enable_bucket": True, "resolution": "96,96", "min_bucket_reso": 64}, None)
    if rule_id == "image_side_below_bucket_step":
        from PIL import Image

        Image.new("RGB", (40, 300)).save(tmp_path / "img" / "2_ohwx" / "a.png")
        bucketed = {**base, "enable_bucket": True, "bucket_reso_steps": 64}
        return ({**bucketed, "bucket_no_upscale": True}, None), (bucketed, None)
    if rule_id == "vae_missing":
        return ({**base, "vae": str(tmp_path / "vae.safetensors")}, None), ({**base, "vae": str(tmp_path / "w.safetensors")}, None)
    if rule_id == "resume_state_missing":
        return ({**base, "resume": str(tmp_path / "gone")}, None), ({**base, "resume": str(tmp_path / "state")}, None)
    raise AssertionError(rule_id)


@pytest.mark.parametrize("rule_id", FILE_RULES, ids=lambda r: f"{r}@{_line(r)}")
def test_file_rule_fires_on_missing_files_and_not_on_present_ones(rule_id, tmp_path):
    (bad, bad_ds), (good, good_ds) = _file_case(rule_id, tmp_path)
    res = engine.check(bad, SD, dataset=bad_ds, complete=True, filesystem=True)
    assert [p.rule for p in res.problems + res.warnings].count(rule_id) == 1, (res.problems, res.warnings)
    res = engine.check(good, SD, dataset=good_ds, complete=True, filesystem=True)
    assert rule_id not in [p.rule for p in res.problems + res.warnings], (res.problems, res.warnings)
    # Without file access the rule is not decided at all.
    res = engine.check(bad, SD, dataset=bad_ds, complete=True, filesystem=False)
    assert rule_id not in [p.rule for p in res.problems + res.warnings]


# script -> the model files its load_target_model opens (each key as the entry script names it)
MODEL_FILES = {FX: ("clip_l", "t5xxl", "ae"), S3: ("clip_l", "clip_g", "t5xxl"), LU: ("gemma2", "ae"),
               HY: ("text_encoder", "byt5", "vae"), AN: ("qwen3", "vae")}


@pytest.mark.parametrize("script", sorted(MODEL_FILES))
def test_each_model_file_a_script_opens_is_required_and_must_exist(script, tmp_path):
    files = {}
    for key in MODEL_FILES[script]:
        (tmp_path / f"{key}.safetensors").write_bytes(b"0")
        files[key] = str(tmp_path / f"{key}.safetensors")
    (tmp_path / "m.safetensors").write_bytes(b"0")
    cfg = {**BASE[script], "pretrained_model_name_or_path": str(tmp_path / "m.safetensors"), **files}

    def rules(c, **kw):
        res = engine.check(c, script, complete=True, **kw)
        return [p.rule for p in res.problems + res.warnings]

    assert "model_files_required" not in rules(cfg, filesystem=True)
    assert "model_file_missing" not in rules(cfg, filesystem=True)
    for key in MODEL_FILES[script]:
        gone = {k: v for k, v in cfg.items() if k != key}
        assert rules(gone).count("model_files_required") == 1, key
        moved = {**cfg, key: str(tmp_path / "gone" / f"{key}.safetensors")}
        found = rules(moved, filesystem=True)
        # A missing VAE is vae_missing's to say, once.
        assert found.count("model_file_missing") == (0 if key == "vae" else 1), (key, found)
        assert found.count("vae_missing") == (1 if key == "vae" else 0), (key, found)
        assert "model_file_missing" not in rules(moved, filesystem=False)
    # Chroma runs on flux_train_network.py without CLIP-L.
    if script == FX:
        chroma = {k: v for k, v in cfg.items() if k != "clip_l"}
        assert "model_files_required" not in rules({**chroma, "model_type": "chroma"})


def test_every_rule_has_a_test_and_a_source_line():
    ids = {r.id for r in engine.rules()}
    assert ids == set(EXAMPLES) | set(FILE_RULES) | {"model_file_missing"}
    for r in engine.rules():
        path, _, line = r.line.partition(":")
        assert path.endswith(".py") and line.isdigit(), r.line
        assert r.where.split(":")[0].split(" ")[0].endswith(".py") or r.where.startswith("networks/"), r.where


def test_complete_only_rules_stay_quiet_for_a_fragment():
    res = engine.check({"network_dim": 8}, SD)
    assert res.ok and res.problems == []
    res = engine.check({"network_dim": 8}, SD, complete=True)
    assert {p.rule for p in res.problems} == {"pretrained_model_required", "network_module_required",
                                              "resolution_required"}


def test_rules_apply_only_to_their_scripts():
    # FLUX has its own 64 check; the SDXL trainer only needs 32.
    cfg = {"enable_bucket": True, "bucket_reso_steps": 32}
    assert "bucket_reso_steps_multiple_of_64" in [p.rule for p in engine.check({**BASE[FX], **cfg}, FX).problems]
    assert engine.check({**BASE[XL], **cfg}, XL).ok


@pytest.mark.parametrize("script, multiple", [(SD, 64), (FX, 64), (LU, 64), (HY, 64), (XL, 32), (S3, 32), (AN, 16),
                                              (DB, 64), (FT, 64), (XLF, 32), (FXF, 16), (S3F, 8)])
def test_bucket_reso_steps_is_refused_per_script_and_only_with_buckets(script, multiple):
    # verify_bucket_reso_steps asserts only when the dataset keeps a step, i.e. with enable_bucket.
    def refused(enable_bucket, steps):
        res = engine.check({**BASE[script], "enable_bucket": enable_bucket, "bucket_reso_steps": steps}, script)
        return [p.rule for p in res.problems if "bucket_reso_steps" in p.keys]
    for steps in (1, multiple // 2, multiple + multiple // 2):
        assert refused(True, steps), (script, steps)
        assert refused(False, steps) == [], (script, steps)
    assert refused(True, multiple) == [] and refused(True, 2 * multiple) == []


def test_a_rule_fires_once_even_when_many_subsets_break_it():
    d = {"datasets": [{"subsets": [{"image_dir": "a", "color_aug": True}, {"image_dir": "b", "random_crop": True}]}]}
    res = engine.check({**BASE[SD], "cache_latents": True}, SD, dataset=d)
    assert [p.rule for p in res.problems] == ["cache_latents_with_augmentation"]


def test_dataset_precedence_subset_over_dataset_over_general_over_config():
    # The subset turns shuffling off, so caching is allowed though general and the config shuffle.
    d = {"general": {"shuffle_caption": True},
         "datasets": [{"shuffle_caption": True, "subsets": [{"image_dir": "a", "shuffle_caption": False}]}]}
    cfg = {**BASE[XL], "cache_text_encoder_outputs": True, "network_train_unet_only": True, "shuffle_caption": True}
    assert engine.check(cfg, XL, dataset=d).ok
    d["datasets"][0]["subsets"][0].pop("shuffle_caption")
    assert not engine.check(cfg, XL, dataset=d).ok


def test_bucket_checks_use_the_rounded_limits_like_sd_scripts():
    # 520 rounds down to 512 before the comparison with the 512 px resolution: accepted, with a warning.
    res = engine.check({**BASE[SD], "enable_bucket": True, "min_bucket_reso": 520}, SD)
    assert res.ok and [w.rule for w in res.warnings] == ["min_bucket_reso_rounded_down"]
    assert "512" in res.warnings[0].message


def test_docs_list_every_rule():
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "check.md").read_text()
    missing = [r.id for r in engine.rules() if f"`{r.id}`" not in doc]
    assert missing == []


def test_hub_ids_are_not_missing_files_but_local_looking_paths_are(tmp_path):
    base = _tree(tmp_path)
    for hub in ("stabilityai/stable-diffusion-xl-base-0.9", "runwayml/stable-diffusion-v1-5"):
        res = engine.check({**base, "pretrained_model_name_or_path": hub}, SD, complete=True, filesystem=True)
        assert "pretrained_model_missing" not in [p.rule for p in res.problems], hub
    for path in ("models/sd15.safetensors", "C:\\models\\sd15.safetensors", "./sd15"):
        res = engine.check({**base, "pretrained_model_name_or_path": path}, SD, complete=True, filesystem=True)
        assert "pretrained_model_missing" in [p.rule for p in res.problems], path


def test_a_missing_dataset_file_is_one_problem_not_two(tmp_path):
    base = {**_tree(tmp_path), "dataset_config": str(tmp_path / "gone.toml")}
    base.pop("train_data_dir")
    res = engine.check(base, SD, complete=True, filesystem=True)
    assert [p.rule for p in res.problems] == ["dataset_config_missing"]


@pytest.mark.parametrize("family, rank, refused", [
    ("sd15", 4, True),    # 320 = 5 x 64: no even block size of at most 4 times a power of two
    ("sd15", 16, False),  # 320 = 10 x 32
    ("sdxl", 32, False),
    ("sd35l", 32, True),  # 2432 = 19 x 128
    ("sd35l", 64, True),
    ("flux", 64, False),  # 3072 = 48 x 64
])
def test_lycoris_boft_at_a_rank_that_cannot_split_the_models_widths_is_refused(family, rank, refused):
    from kohya_tuner.families import FAMILIES

    fam = FAMILIES[family]
    cfg = {"network_module": "lycoris.kohya", "network_args": ["algo=boft"], "network_dim": rank,
           "network_train_unet_only": True}
    result = engine.check(cfg, fam.script, family=family)
    assert ("lycoris_boft_unsplittable" in {p.rule for p in result.problems}) is refused
    # Another algo, or no family known, is never refused by this rule.
    other = engine.check({**cfg, "network_args": ["algo=locon"]}, fam.script, family=family)
    unknown = engine.check(cfg, fam.script)
    assert "lycoris_boft_unsplittable" not in {p.rule for p in other.problems + unknown.problems}
