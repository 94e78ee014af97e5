"""`config --gui-json FILE` and `fit --gui-json FILE`: the kohya_ss GUI file is written like every
other output (inside --out, never over a user's file without --force, 0600 when it holds a secret),
and what it holds reads back (kohya_tuner.config_gui) as the training of the TOML beside it."""

import json
import os
import stat

from gui_export_cases import differences

from kohya_tuner import config_gui, config_io
from tests.clihelp import invoke

ARGS = ("config", "--model", "sd15", "--job", "character", "--gpu", "12", "--base", "/models/base.safetensors")


def _same_training(toml_path, gui_path, dataset):
    gui_text = gui_path.read_text(encoding="utf-8")
    fields = json.loads(gui_text)
    loaded = config_gui.read_gui_json(gui_text)
    ours = config_io.read_config(toml_path)
    prompts = (toml_path.parent / "sample_prompts.txt").read_text(encoding="utf-8")
    assert loaded.script == ours.script
    return differences({**ours.config, "dataset_config": str(dataset)}, loaded.config, ours.script,
                       ours_prompts=prompts, gui_prompts=fields["sample_prompts"] or None)


def test_config_writes_the_gui_file_into_out_and_reports_it(tmp_path):
    out = tmp_path / "run"
    res = invoke(*ARGS, "--out", str(out), "--gui-json", "kohya_gui.json", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    gui = out / "kohya_gui.json"
    assert data["gui_json"]["path"] == str(gui) and data["files"]["kohya_gui.json"] == str(gui)
    assert data["gui_json"]["additional_parameters"] == ["no_half_vae"]
    assert {"config", "files", "estimate", "steps"} <= set(data)  # the existing keys stay
    assert json.loads(gui.read_text(encoding="utf-8"))["dataset_config"] == str(out.absolute() / "dataset.toml")
    assert _same_training(out / "config.toml", gui, out.absolute() / "dataset.toml") == []


def test_config_without_the_flag_reports_no_gui_file(tmp_path):
    res = invoke(*ARGS, "--out", str(tmp_path / "run"), "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["gui_json"] is None


def test_an_existing_file_is_kept_unless_force_and_then_backed_up(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    mine = out / "kohya_gui.json"
    mine.write_text('{"mine": 1}\n', encoding="utf-8")
    os.chmod(mine, 0o640)
    res = invoke(*ARGS, "--out", str(out), "--gui-json", "kohya_gui.json")
    assert res.exit_code == 2 and "already exist" in res.output
    assert mine.read_text(encoding="utf-8") == '{"mine": 1}\n' and not (out / "config.toml").exists()
    res = invoke(*ARGS, "--out", str(out), "--gui-json", "kohya_gui.json", "--force")
    assert res.exit_code == 0, res.output
    assert (out / "kohya_gui.json.bak").read_text(encoding="utf-8") == '{"mine": 1}\n'
    assert stat.S_IMODE(mine.stat().st_mode) == 0o640  # a replaced file keeps its permissions


def test_a_gui_file_outside_out_or_on_a_plan_file_is_refused_before_anything_is_written(tmp_path):
    out = tmp_path / "run"
    for target, words in ((tmp_path / "elsewhere.json", "outside"), ("config.toml", "plan's own"),
                          ("kohya.txt", ".json")):
        res = invoke(*ARGS, "--out", str(out), "--gui-json", str(target))
        assert res.exit_code == 2 and words in res.output, res.output
        assert "Traceback" not in res.output
        assert not out.exists() and not (tmp_path / "elsewhere.json").exists()


def test_a_setting_the_gui_cannot_carry_is_refused_with_nothing_written(tmp_path):
    out = tmp_path / "run"
    res = invoke(*ARGS, "--out", str(out), "--gui-json", "k.json", "--set", 'network_args=["unknown_opt=3"]', "--json")
    assert res.exit_code == 2
    assert "unknown_opt=3 have no kohya_ss GUI field" in json.loads(res.stdout)["error"]["message"]
    assert not out.exists()


def test_a_secret_makes_the_gui_file_private_too(tmp_path):
    out = tmp_path / "run"
    res = invoke(*ARGS, "--out", str(out), "--gui-json", "k.json", "--set", "wandb_api_key=abc123",
                 "--set", "log_with=wandb")
    assert res.exit_code == 0, res.output
    assert stat.S_IMODE((out / "k.json").stat().st_mode) == 0o600
    assert json.loads((out / "k.json").read_text(encoding="utf-8"))["wandb_api_key"] == "abc123"


def test_fit_writes_the_gui_file_beside_out(tmp_path):
    out = tmp_path / "run"
    assert invoke("config", "--model", "sd15", "--job", "character", "--gpu", "12", "--network", "lycoris:loha",
                  "--base", "/models/base.safetensors", "--out", str(out)).exit_code == 0
    res = invoke("fit", str(out / "config.toml"), "--gpu", "6", "--out", str(out / "fit6.toml"), "--dataset",
                 str(out / "dataset.toml"), "--gui-json", "fit6.json", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["gui_json"]["path"] == str(out / "fit6.json") and data["out"]
    fields = json.loads((out / "fit6.json").read_text(encoding="utf-8"))
    assert fields["LoRA_type"] == "LyCORIS/LoHa"
    assert _same_training(out / "fit6.toml", out / "fit6.json", out / "dataset.toml") == []


def test_fit_refuses_a_gui_file_on_its_input(tmp_path):
    out = tmp_path / "run"
    assert invoke(*ARGS, "--out", str(out), "--gui-json", "k.json").exit_code == 0
    before = (out / "k.json").read_text(encoding="utf-8")
    res = invoke("fit", str(out / "k.json"), "--gpu", "6", "--out", str(out / "f.toml"), "--gui-json",
                 str(out / "k.json"), "--force")
    assert res.exit_code == 2 and "is the input" in res.output, res.output
    assert not (out / "f.toml").exists() and (out / "k.json").read_text(encoding="utf-8") == before


def test_fit_of_a_gui_file_keeps_its_prompts(tmp_path):
    """A GUI file's prompts are its own field (the GUI writes <output_dir>/sample/prompt.txt from it):
    fit's GUI file carries that text over, though the prompt file does not exist yet."""
    out = tmp_path / "run"
    assert invoke(*ARGS, "--out", str(out), "--gui-json", "k.json").exit_code == 0
    before = json.loads((out / "k.json").read_text(encoding="utf-8"))
    res = invoke("fit", str(out / "k.json"), "--gpu", "8", "--out", str(out / "f.toml"), "--gui-json", "f.json",
                 "--json")
    assert res.exit_code == 0, res.output
    after = json.loads((out / "f.json").read_text(encoding="utf-8"))
    assert after["sample_prompts"] == before["sample_prompts"] and before["sample_prompts"]
    assert after["dataset_config"] == before["dataset_config"]


def test_fit_writes_nothing_when_the_gui_file_is_the_users(tmp_path):
    out = tmp_path / "run"
    assert invoke(*ARGS, "--out", str(out)).exit_code == 0
    (out / "g.json").write_text('{"mine": 1}\n', encoding="utf-8")
    res = invoke("fit", str(out / "config.toml"), "--gpu", "8", "--out", str(out / "f.toml"), "--gui-json", "g.json")
    assert res.exit_code == 2 and "g.json already exists" in res.output, res.output
    assert not (out / "f.toml").exists() and (out / "g.json").read_text(encoding="utf-8") == '{"mine": 1}\n'
