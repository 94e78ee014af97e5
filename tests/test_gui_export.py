"""`config --gui-json`: our presets as kohya_ss GUI files, read back by our own GUI reader
(kohya_tuner.config_gui, which tests/test_kohya_gui_oracle.py holds to the GUI's own code) into
the training our config.toml describes. tests/gui_export_cases.py says what "the same" allows."""

import json

import pytest
from gui_export_cases import (
    EXPORTED_FAMILIES,
    NETWORKS,
    NOT_EXPORTED,
    differences,
    launch_pairs,
    plan_case,
)

from kohya_tuner import config_gui, gui_export, presets
from kohya_tuner.errors import UserError
from kohya_tuner.planfiles import accelerate_args

CASES = [(m, j, gb) for m in EXPORTED_FAMILIES for j in presets.JOBS for gb in (8, 12, 24)]


def round_trip(model, job, gb, network="lora"):
    plan, ds_path, prompts, _toml = plan_case(model, job, gb, network)
    exp = gui_export.for_plan(plan, ds_path, prompts)
    text = exp.dumps()
    fields = json.loads(text)
    loaded = config_gui.read_gui_json(text)
    ours = {**plan.config, "dataset_config": ds_path}
    diff = differences(ours, loaded.config, plan.family.script, ours_prompts=prompts,
                       gui_prompts=fields["sample_prompts"] or None, schnell=plan.variant == "schnell")
    if loaded.script != plan.family.script:
        diff.append(f"entry script {loaded.script}, ours {plan.family.script}")
    ours_launch = launch_pairs(accelerate_args(plan.config.get("mixed_precision", "no")))
    if launch_pairs(loaded.launch) != ours_launch:
        diff.append(f"accelerate options {loaded.launch}, ours {ours_launch}")
    return plan, exp, fields, loaded, diff


@pytest.mark.parametrize("model,job,gb", CASES, ids=lambda v: str(v))
def test_every_preset_round_trips(model, job, gb):
    plan, exp, fields, loaded, diff = round_trip(model, job, gb)
    assert not diff, diff
    assert set(fields) == set(config_gui._fields()["lora"]), "every LoRA-tab field is written"
    # The LoRA tab writes no_half_vae only with SDXL ticked and cache_text_encoder_outputs_to_disk
    # only for FLUX.1/SD3: our SD 1.5/2.x and SDXL presets pass those through additional_parameters.
    # Every other preset setting has its field.
    assert set(exp.additional) <= {"no_half_vae", "cache_text_encoder_outputs_to_disk"}, exp.additional
    assert fields["additional_parameters"] == " ".join(f"--{k}" for k in exp.additional)


@pytest.mark.parametrize("network", NETWORKS[1:])
@pytest.mark.parametrize("model", ["sd15", "sdxl", "flux"])
def test_lycoris_round_trips(model, network):
    plan, exp, fields, loaded, diff = round_trip(model, "character", 12, network)
    assert not diff, diff
    assert fields["LoRA_type"].startswith("LyCORIS/")
    assert loaded.config["network_module"] == "lycoris.kohya"


def test_the_family_checkbox_and_lora_type():
    _plan, _exp, f, _l, _d = round_trip("sdxl", "style", 12)
    assert (f["sdxl"], f["flux1_checkbox"], f["sd3_checkbox"], f["LoRA_type"]) == (True, False, False, "Standard")
    _plan, _exp, f, _l, _d = round_trip("flux", "style", 12)
    assert (f["sdxl"], f["flux1_checkbox"], f["LoRA_type"]) == (False, True, "Flux1")
    _plan, _exp, f, _l, _d = round_trip("chroma", "style", 12)
    assert (f["flux1_checkbox"], f["model_type"]) == (True, "chroma")
    _plan, _exp, f, _l, _d = round_trip("sd35m", "style", 12)
    assert f["sd3_checkbox"] and f["sd3_clip_l"] == "/models/clip_l.safetensors"
    for model, box, lora_type in (("lumina2", "lumina_checkbox", "Lumina"), ("anima", "anima_checkbox", "Anima"),
                                  ("hunyuan21", "hunyuan_image_checkbox", "HunyuanImage-2.1")):
        _plan, _exp, f, loaded, _d = round_trip(model, "style", 12)
        assert f[box] and f["LoRA_type"] == lora_type and not f["sdxl"], model
    _plan, _exp, f, _l, _d = round_trip("sd15", "style", 12, "lycoris:lokr")
    assert f["LoRA_type"] == "LyCORIS/LoKr" and f["factor"] == 8 and f["conv_dim"] == 4


def test_the_dataset_goes_through_dataset_config_and_prompts_as_text():
    plan, exp, f, loaded, _d = round_trip("sd15", "character", 8)
    assert f["dataset_config"] == "/runs/r1/dataset.toml" and f["train_data_dir"] == ""
    assert f["sample_prompts"] and "\n" in f["sample_prompts"]
    assert loaded.config["sample_prompts"] == plan.config["output_dir"] + "/sample/prompt.txt"


def test_every_family_is_exported():
    assert NOT_EXPORTED == []


def test_a_script_the_lora_tab_does_not_launch_is_refused_by_name():
    with pytest.raises(UserError) as err:
        gui_export.export({"learning_rate": 1e-4}, "sdxl_train.py", dataset_config=None, sample_prompts=None)
    assert "sdxl_train.py is not launched by the kohya_ss GUI's LoRA tab" in err.value.message


BASE = {"network_module": "networks.lora", "network_dim": 8, "network_alpha": 4.0, "learning_rate": 1e-4,
        "output_dir": "/o", "output_name": "x", "pretrained_model_name_or_path": "/m.safetensors",
        "resolution": "512", "max_train_steps": 10, "save_precision": "fp16", "mixed_precision": "fp16",
        "caption_extension": ".txt", "lr_scheduler": "constant"}


def _export(cfg, script="train_network.py"):
    return gui_export.export(cfg, script, dataset_config="/d.toml", sample_prompts=None,
                             launch=accelerate_args(cfg.get("mixed_precision", "no")))


def _back(exp, cfg, script="train_network.py"):
    loaded = config_gui.read_gui_json(exp.dumps())
    return differences({**cfg, "dataset_config": "/d.toml"}, loaded.config, script), loaded


def test_a_setting_without_a_field_goes_to_additional_parameters_and_arrives():
    cfg = {**BASE, "token_warmup_min": 5, "zero_terminal_snr": True, "lr_warmup_steps": 0.1}
    exp = _export(cfg)
    assert set(exp.additional) == {"token_warmup_min", "zero_terminal_snr", "lr_warmup_steps"}
    assert any("additional_parameters" in n for n in exp.notes)
    diff, loaded = _back(exp, cfg)
    assert not diff, diff
    assert loaded.config["zero_terminal_snr"] is True and loaded.config["lr_warmup_steps"] == 0.1


def test_a_value_the_gui_would_split_is_refused_not_dropped():
    with pytest.raises(UserError) as err:
        _export({**BASE, "training_comment_x": "a b"})
    assert "training_comment_x" in err.value.message
    with pytest.raises(UserError) as err:
        _export({**BASE, "optimizer_args": ["betas=0.9, 0.99"]})
    assert "optimizer_args" in err.value.message


def test_optimizer_args_and_learning_rates_round_trip():
    for extra in ({"optimizer_args": ["weight_decay=0.01", "betas=0.9,0.99"]},
                  {"unet_lr": 1e-4, "text_encoder_lr": [5e-5, 2e-5]},
                  {"text_encoder_lr": 5e-5},
                  {"network_train_unet_only": True, "unet_lr": 3e-4},
                  {"network_args": ["conv_dim=4", "conv_alpha=1"]},
                  {"xformers": True}, {"sdpa": True}, {"lr_warmup_steps": 30},
                  # 0 that the LoRA tab would leave out (then sd-scripts' 1.0 / a random seed)
                  {"max_grad_norm": 0.0, "seed": 0},
                  {"network_args": ["conv_dim=4", "conv_alpha=1", "rank_dropout=0.1", "module_dropout=0.1"]},
                  {"network_args": ["loraplus_lr_ratio=16", "down_lr_weight=sine"]},
                  # values the GUI's form refuses (its slider's maximum, its list of extensions)
                  {"network_dim": 1024}, {"caption_extension": ".txt2"}, {"bucket_reso_steps": 256}):
        cfg = {**BASE, **extra}
        diff, _loaded = _back(_export(cfg), cfg)
        assert not diff, (extra, diff)


def test_a_prompt_file_that_could_not_be_read_passes_by_path():
    cfg = {**BASE, "sample_prompts": "/o/prompts.txt", "sample_every_n_steps": 5}
    exp = _export(cfg)
    assert exp.fields["sample_prompts"] == "" and "sample_prompts" in exp.additional
    diff, loaded = _back(exp, cfg)
    assert loaded.config["sample_prompts"] == "/o/prompts.txt" and not diff, diff


def test_flux_network_args_take_their_fields():
    cfg = {**BASE, "network_module": "networks.lora_flux", "ae": "/ae.sft", "t5xxl": "/t5.sft", "clip_l": "/c.sft",
           "network_args": ["img_attn_dim=4", "rank_dropout=0.1", "ggpo_beta=0.01", "ggpo_sigma=0.03",
                            "loraplus_unet_lr_ratio=4"]}
    exp = _export(cfg, "flux_train_network.py")
    assert exp.fields["train_lora_ggpo"] and exp.fields["img_attn_dim"] == "4" and not exp.additional
    diff, _loaded = _back(exp, cfg, "flux_train_network.py")
    assert not diff, diff


def test_network_args_without_a_field_are_refused():
    with pytest.raises(UserError) as err:
        _export({**BASE, "network_args": ["unknown_opt=3"]})
    assert "unknown_opt=3" in err.value.message


def test_a_value_the_gui_form_refuses_goes_on_the_command_line_or_is_refused():
    exp = _export({**BASE, "network_dim": 1024})
    assert exp.fields["network_dim"] == 512 and "--network_dim 1024" in exp.fields["additional_parameters"]
    with pytest.raises(UserError) as err:
        _export({**BASE, "network_args": ["conv_dim=1024", "conv_alpha=1"]})
    assert "conv_dim field cannot hold 1024" in err.value.message
