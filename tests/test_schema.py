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
    ("network_dim", 16.5),
    ("learning_rate", "1e-4"), ("resolution", 1024), ("resolution", [1024, 768]), ("resolution", "big"),
    ("network_args", "conv_dim=4"), ("network_args", ["a=1", 2]),
    # Outside argparse's choices, and refused by the code that reads it (accelerate's precisions).
    ("mixed_precision", "fp32"),
])
def test_values_the_code_cannot_use_are_errors(key, value):
    assert set(keys(schema.validate_config({key: value}, "sdxl_train_network.py"))) == {key}


@pytest.mark.parametrize("key,value", [
    # A --config_file value never passes argparse: a flag is tested for truth, a float warmup is a
    # fraction of all steps, and `choices` are not applied (the real trainer trains these).
    ("gradient_checkpointing", "yes"), ("lr_warmup_steps", 100.0), ("max_token_length", 75),
    ("save_precision", "fp8"), ("dynamo_backend", "no"), ("mixed_precision", "fp8"), ("log_with", "mlflow"),
    ("sample_sampler", "unipc"), ("resize_interpolation", "box"),
    # true for an integer: Python computes with 1 (a rank-1 LoRA), as a schema typed `int` accepts it.
    ("network_dim", True),
])
def test_config_file_values_argparse_would_refuse_are_warnings(key, value):
    extra = {"lr_scheduler": "constant_with_warmup"} if key == "lr_warmup_steps" else {}
    problems = schema.validate_config({key: value, **extra}, "sdxl_train_network.py")
    assert keys(problems) == [] and keys(problems, "warning") == [key], problems


def test_the_warning_says_what_the_trainer_does_with_the_value():
    (w,) = schema.validate_config({"max_token_length": 75}, "train_network.py")
    assert w.rule == "choices_not_applied" and "unset" in w.message
    (w,) = schema.validate_config({"max_token_length": 100}, "train_network.py")
    assert "not traced" in w.message


@pytest.mark.parametrize("config,key", [
    ({"console_log_level": "info"}, "console_log_level"), ({"log_with": "neptune"}, "log_with"),
    ({"loss_type": "l3"}, "loss_type"), ({"loss_type": "huber", "huber_schedule": "cosine"}, "huber_schedule"),
    ({"torch_compile": True, "dynamo_backend": "turbo"}, "dynamo_backend"),
    ({"resize_interpolation": "sinc"}, "resize_interpolation"),
])
def test_outside_choices_the_code_refuses_is_one_error_from_its_rule(config, key):
    problems = schema.validate_config(config, "train_network.py")
    from kohya_tuner.check import check

    result = check(config, "train_network.py")
    assert key in [p.key for p in result.problems] and key not in [w.key for w in result.warnings]
    assert all(p.rule.endswith("_unknown") for p in result.problems), result.problems
    assert key in keys(problems)


def test_without_torch_compile_any_dynamo_backend_trains():
    from kohya_tuner.check import check

    assert check({"dynamo_backend": "turbo"}, "train_network.py").ok


def test_a_command_line_value_is_held_to_argparse():
    from kohya_tuner.check.engine import key_problems

    assert [p.severity for p in key_problems({"max_token_length": 75}, "train_network.py",
                                             origin="command_line")] == ["error"]
    with pytest.raises(ValueError):
        key_problems({}, "train_network.py", origin="gui")


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
