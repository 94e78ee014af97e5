from __future__ import annotations

import pytest

from kohya_tuner import schema
from kohya_tuner.families import FAMILIES

FLUX = FAMILIES["flux"]
SDXL = FAMILIES["sdxl"]
SD15 = FAMILIES["sd15"]


def keys(problems, severity="error"):
    return [p.key for p in problems if p.severity == severity]


def test_every_family_script_has_a_schema_with_its_memory_options():
    for fam in FAMILIES.values():
        args = schema.script_args(fam.script)
        assert "mixed_precision" in args and "gradient_checkpointing" in args
    assert "blocks_to_swap" in schema.script_args("flux_train_network.py")
    assert "cache_text_encoder_outputs" not in schema.script_args("train_network.py")


def test_unknown_key_names_the_closest_valid_key():
    (p,) = schema.validate_config({"learning_rat": 1e-4}, "train_network.py")
    assert p.key == "learning_rat" and "'learning_rate'" in p.message


def test_dashed_cli_spelling_is_suggested_as_the_dest():
    (p,) = schema.validate_config({"network-dim": 8}, "train_network.py")
    assert "network_dim" in p.message


@pytest.mark.parametrize("key,value", [
    ("network_dim", 16.5), ("network_dim", True), ("gradient_checkpointing", "yes"),
    ("learning_rate", "1e-4"), ("resolution", 1024), ("resolution", [1024, 768]), ("resolution", "big"),
    ("network_args", "conv_dim=4"), ("network_args", ["a=1", 2]), ("mixed_precision", "fp32"),
    ("lr_warmup_steps", 100.0),
])
def test_wrong_types_and_choices_are_errors(key, value):
    assert set(keys(schema.validate_config({key: value}, "sdxl_train_network.py"))) == {key}


@pytest.mark.parametrize("key,value", [
    ("network_dim", 16), ("learning_rate", 1), ("resolution", "1024,768"), ("lr_warmup_steps", 0),
    ("lr_warmup_steps", 0.0001), ("text_encoder_lr", 5e-5), ("text_encoder_lr", [5e-5, 1e-5]),
    ("network_args", ["conv_dim=4"]), ("mixed_precision", "bf16"),
])
def test_right_values_pass(key, value):
    assert schema.validate_config({key: value}, "sdxl_train_network.py") == []


@pytest.mark.parametrize("config,family,bad", [
    ({"fp8_base": True, "mixed_precision": "no"}, FLUX, "fp8_base"),
    ({"full_bf16": True, "mixed_precision": "fp16"}, SDXL, "full_bf16"),
    ({"blocks_to_swap": 8, "cpu_offload_checkpointing": True, "mixed_precision": "bf16"}, FLUX,
     "cpu_offload_checkpointing"),
    ({"blocks_to_swap": 36}, FLUX, "blocks_to_swap"),
    ({"cpu_offload_checkpointing": True, "gradient_checkpointing": True}, SD15, "cpu_offload_checkpointing"),
    ({"bucket_reso_steps": 32, "enable_bucket": True}, SD15, "bucket_reso_steps"),
    ({"bucket_reso_steps": 32, "enable_bucket": True}, FLUX, "bucket_reso_steps"),
    ({"cache_text_encoder_outputs": True, "shuffle_caption": True, "network_train_unet_only": True}, SDXL,
     "cache_text_encoder_outputs"),
    ({"cache_text_encoder_outputs": True}, SDXL, "cache_text_encoder_outputs"),
    ({"cache_latents": True, "color_aug": True}, SD15, "cache_latents"),
    ({"fused_backward_pass": True, "optimizer_type": "AdamW"}, SDXL, "fused_backward_pass"),
    ({"network_module": "networks.lora"}, FLUX, "network_module"),
])
def test_known_constraints_are_errors(config, family, bad):
    assert bad in keys(schema.validate_config(config, family.script, family=family))


def test_caption_dropout_in_the_dataset_blocks_text_encoder_caching():
    config = {"cache_text_encoder_outputs": True, "network_train_unet_only": True}
    dataset = {"datasets": [{"subsets": [{"image_dir": "x", "caption_dropout_rate": 0.1}]}]}
    assert "cache_text_encoder_outputs" in keys(schema.validate_config(config, SDXL.script, dataset=dataset))
    assert schema.validate_config(config, SDXL.script) == []


def test_split_mode_is_only_a_warning():
    problems = schema.validate_config({"split_mode": True}, FLUX.script)
    assert keys(problems) == [] and keys(problems, "warning") == ["split_mode"]


def test_dataset_schema_is_strict_like_sd_scripts():
    good = {"general": {"shuffle_caption": False, "caption_extension": ".txt"},
            "datasets": [{"resolution": [1024, 768], "batch_size": 2,
                          "subsets": [{"image_dir": "img", "num_repeats": 3, "class_tokens": "ohwx"}]}]}
    assert schema.validate_dataset(good, SDXL) == []
    bad = {"general": {"interpolation_type": "lanczos"}, "validation_seed": 1,
           "datasets": [{"validation_split": 0, "subsets": [{"num_repeats": 1.5}]}]}
    found = {p.key: p.message for p in schema.validate_dataset(bad, SDXL)}
    assert "resize_interpolation" in found["general.interpolation_type"]
    assert "validation_seed" in found
    assert "0.0" in found["datasets[0].validation_split"]
    assert "datasets[0].subsets[0].num_repeats" in found
    assert "needs image_dir" in found["datasets[0].subsets[0]"]


def test_dataset_bucket_step_follows_the_family():
    d = {"general": {"bucket_reso_steps": 32, "enable_bucket": True, "resolution": 512},
         "datasets": [{"subsets": [{"image_dir": "x"}]}]}
    assert schema.validate_dataset(d, SDXL) == []
    assert [p.key for p in schema.validate_dataset(d, SD15)] == ["bucket_reso_steps"]
    # Without buckets sd-scripts never looks at the step (DreamBoothDataset sets it to None).
    d["general"]["enable_bucket"] = False
    assert schema.validate_dataset(d, SD15) == []


def test_warmup_with_the_default_constant_schedule_is_refused():
    (p,) = schema.errors_only(schema.validate_config({"lr_warmup_steps": 100}, SD15.script))
    assert p.rule == "scheduler_without_warmup" and p.where.endswith("get_scheduler_fix")
    # A fraction that rounds to no step is no warmup at all.
    assert schema.validate_config({"lr_warmup_steps": 0.0001}, SD15.script) == []
    assert schema.validate_config({"lr_warmup_steps": 100, "lr_scheduler": "cosine"}, SD15.script) == []


def test_validation_is_fast_enough_for_the_ladder_to_call_per_candidate():
    # Not a timing assertion: the schema is read once and cached, so repeated calls share it.
    from kohya_tuner.check import argschema

    schema.validate_config({"network_dim": 8}, SD15.script)
    before = argschema.raw_schema.cache_info().misses
    for _ in range(3):
        schema.validate_config({"network_dim": 8}, SD15.script)
    assert argschema.raw_schema.cache_info().misses == before


def test_importing_schema_does_not_read_args_json_or_import_pydantic():
    import subprocess
    import sys

    code = ("import sys, kohya_tuner.schema as s, kohya_tuner.check as c; "
            "print(s.raw_schema.cache_info().currsize, 'pydantic' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["0", "False", "False"]
