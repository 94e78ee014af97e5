from __future__ import annotations

import json
from pathlib import Path

import pytest
import toml

from kohya_tuner import config_io, schema
from kohya_tuner.errors import UserError

from tests.refdata import shared_path


def test_sd_scripts_toml_is_flattened_like_sd_scripts(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[model]\nnetwork_dim = 8\n[training]\nnetwork_dim = 16\nlearning_rate = 1e-4\ntop = 1\n')
    loaded = config_io.read_config(f)
    assert loaded.config == {"network_dim": 16, "learning_rate": 1e-4, "top": 1}
    assert loaded.fmt == "toml"


def test_toml_errors_name_line_and_column(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text('network_dim = 8\nlearning_rate = [1, "a"]\n')
    with pytest.raises(UserError, match="line 2"):
        config_io.read_config(f)


@pytest.mark.parametrize("name,family,fmt", [
    ("01_kohya-ss_sd-scripts_648.toml", "sdxl", "toml"),
    ("05_bmaltais_kohya_ss_156.sh", "sd15", "command_line"),
    ("09_cocktailpeanut_fluxgym_360.sh", "flux", "command_line"),
    ("11_bmaltais_kohya_ss_1184.json", "sd15", "kohya_gui_json"),
])
def test_real_user_configs_are_read(name, family, fmt):
    loaded = config_io.read_config(shared_path("real-world", "configs", name))
    assert loaded.family.name == family and loaded.fmt == fmt
    assert schema.errors_only(schema.validate_config(loaded.config, loaded.script, family=loaded.family)) == []


def test_console_wrapped_command_line_is_rejoined():
    loaded = config_io.read_config(shared_path("real-world", "configs", "09_cocktailpeanut_fluxgym_360.sh"))
    cfg = loaded.config
    assert cfg["cache_text_encoder_outputs"] is True  # the token the console broke as "--ca" / "che_…"
    assert cfg["optimizer_args"] == ["relative_step=False", "scale_parameter=False", "warmup_init=False"]
    assert cfg["t5xxl"].endswith("t5xxl_fp16.safetensors") and "\\" in cfg["t5xxl"]


def test_windows_command_keeps_backslashes_and_types():
    loaded = config_io.read_config(shared_path("real-world", "configs", "05_bmaltais_kohya_ss_156.sh"))
    cfg = loaded.config
    assert cfg["train_data_dir"] == "D:\\kohya_ss\\NkkCS_LoRa\\img"
    assert cfg["network_alpha"] == 1.0 and cfg["network_dim"] == 8 and cfg["text_encoder_lr"] == [5e-05]
    assert cfg["resolution"] == "512,512" and cfg["xformers"] is True


def test_multiline_shell_command_with_spaces_in_paths(tmp_path):
    f = tmp_path / "train.sh"
    f.write_text('accelerate launch --mixed_precision bf16 \\\n  "my dir/sdxl_train_network.py" \\\n'
                 '  --pretrained_model_name_or_path "/models/my model.safetensors" \\\n'
                 '  --network_args "conv_dim=4" "conv_alpha=1" --gradient_checkpointing\n')
    loaded = config_io.read_config(f)
    assert loaded.family.name == "sdxl"
    assert loaded.config == {"pretrained_model_name_or_path": "/models/my model.safetensors",
                             "network_args": ["conv_dim=4", "conv_alpha=1"], "gradient_checkpointing": True}


def test_unknown_cli_flags_are_noted_not_fatal(tmp_path):
    f = tmp_path / "t.sh"
    f.write_text("python train_network.py --network_dimm 8 --learning_rate 1e-4\n")
    loaded = config_io.read_config(f)
    assert loaded.config == {"learning_rate": 1e-4}
    assert any("network_dim" in n for n in loaded.notes)


def test_truncated_gui_json_is_salvaged_and_gui_fields_mapped():
    loaded = config_io.read_config(shared_path("real-world", "configs", "11_bmaltais_kohya_ss_1184.json"))
    assert any("incomplete" in n for n in loaded.notes)
    cfg = loaded.config
    # The GUI writes its epoch field as `epoch`, a key train_network.py does not take.
    assert loaded.ignored["epoch"] == 100 and cfg["gradient_accumulation_steps"] == 1
    # LoRA_type Standard: the GUI passes conv_dim / conv_alpha only for Kohya LoCon (lora_gui.train_model).
    assert cfg["network_args"] == []
    assert cfg["max_grad_norm"] == 0.0  # from additional_parameters


def test_gui_json_model_flags(tmp_path):
    f = tmp_path / "gui.json"
    f.write_text(json.dumps({"sdxl": True, "network_dim": 32, "optimizer": "Adafactor", "max_resolution": "1024,1024",
                             "xformers": "sdpa", "train_batch_size": "2", "LoRA_type": "Standard"}))
    loaded = config_io.read_config(f)
    assert loaded.family.name == "sdxl"
    # network_module: the GUI passes the one its LoRA type names; the file does not store it.
    # Fields the file lacks keep the GUI's fresh-tab values (tests/test_kohya_gui_oracle.py holds the rest).
    given = {"network_dim": 32, "optimizer_type": "Adafactor", "resolution": "1024,1024",
             "sdpa": True, "train_batch_size": "2", "network_module": "networks.lora"}
    # train_batch_size: the GUI passes a number field's text on as it is, into the TOML.
    assert {k: loaded.config.get(k) for k in given} == given and "xformers" not in loaded.config


@pytest.mark.parametrize("content,match", [(b"", "empty"), (b"\x00\x01binary", "binary")])
def test_unreadable_inputs_are_user_errors(tmp_path, content, match):
    f = tmp_path / "x.toml"
    f.write_bytes(content)
    with pytest.raises(UserError, match=match):
        config_io.read_config(f)


def test_missing_and_directory_inputs(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        config_io.read_config(tmp_path / "nope.toml")
    with pytest.raises(UserError, match="directory"):
        config_io.read_config(tmp_path)


def test_dumps_config_reads_back_unchanged_through_toml_0_10_2():
    cfg = {"resolution": "1024,768", "learning_rate": 1e-05, "network_args": ["a=1", "b=2"], "network_dim": 8,
           "text_encoder_lr": [5e-5, 1e-5], "gradient_checkpointing": True, "output_dir": "C:\\out dir\\ü;x"}
    text = config_io.dumps_config(cfg, {"network_dim": "why\nover two lines"}, script="sdxl_train_network.py")
    assert "# why" in text
    assert config_io.flatten(toml.loads(text)) == cfg


def test_write_new_never_overwrites_silently(tmp_path):
    p = tmp_path / "a" / "config.toml"
    assert config_io.write_new(p, "x = 1\n") is None
    with pytest.raises(UserError, match="already exists"):
        config_io.write_new(p, "x = 2\n")
    assert p.read_text() == "x = 1\n"
    backup = config_io.write_new(p, "x = 2\n", force=True)
    assert backup.read_text() == "x = 1\n" and p.read_text() == "x = 2\n"
    backup2 = config_io.write_new(p, "x = 3\n", force=True)
    assert backup2 != backup and backup2.read_text() == "x = 2\n" and backup.read_text() == "x = 1\n"
    assert config_io.write_new(p, "x = 3\n") is None  # same content is not a clash


def test_effective_settings_follow_dataset_precedence():
    cfg = {"train_batch_size": 1, "resolution": "512"}
    ds = {"general": {"batch_size": 2}, "datasets": [{"resolution": [1024, 768], "subsets": [{"image_dir": "a"}]},
                                                    {"resolution": 512, "batch_size": 4, "subsets": [{"image_dir": "b"}]}]}
    eff = config_io.effective_settings(cfg, ds)
    assert eff["batch_size"] == 2 and eff["resolution"] == (1024, 768)
    assert config_io.effective_settings(cfg)["resolution"] == (512, 512)


def test_a_json_that_is_no_training_config_is_refused_not_read_as_sd15(tmp_path):
    from kohya_tuner.errors import UserError

    other = tmp_path / "sources.json"
    other.write_text('{"01_config.toml": {"url": "https://example.invalid"}, "note": "a list of files"}')
    with pytest.raises(UserError) as err:
        config_io.read_config(other)
    assert "sources.json" in err.value.message and "not a kohya_ss GUI settings file" in err.value.message


@pytest.mark.parametrize("keys,script", [
    ({"learning_rate_te1": 5e-6, "train_text_encoder": True}, "sdxl_train.py"),
    ({"stop_text_encoder_training": 100, "no_token_padding": True}, "train_db.py"),
    ({"blockwise_fused_optimizers": True, "ae": "/m/ae.safetensors"}, "flux_train.py"),
])
def test_a_full_fine_tune_toml_is_read_as_what_it_is(tmp_path, keys, script):
    from kohya_tuner import tomlwrite

    path = tmp_path / "ft.toml"
    path.write_text(tomlwrite.dumps({"pretrained_model_name_or_path": "/m/model.safetensors", "learning_rate": 1e-5,
                                     **keys}), encoding="utf-8")
    loaded = config_io.read_config(path)
    assert loaded.script == script and loaded.family.script == script
    assert any("full fine-tune" in n for n in loaded.notes)


def test_a_lora_toml_with_a_fine_tune_only_key_stays_a_lora(tmp_path):
    path = tmp_path / "lora.toml"
    path.write_text('network_module = "networks.lora"\nlearning_rate_te1 = 1e-5\n', encoding="utf-8")
    assert config_io.read_config(path).script.endswith("_network.py")
