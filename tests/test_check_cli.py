"""`kohya-tuner check` on every input form, the refused-config set and the harness config."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

from tests.clihelp import invoke as _invoke_cli

DATA = Path(__file__).parent / "data"
REFUSED = sorted((DATA / "refused_configs").glob("*.toml"))
# sdxl/ and flux/: start-up rules of sdxl_train_network.py and flux_train_network.py (--model is the folder)
FAMILY_REFUSED = sorted((DATA / "refused_configs").glob("*/*.toml"))


def invoke(*args):
    return _invoke_cli(*[str(a) for a in args])


@pytest.fixture
def realish(tmp_path):
    """Files the harness config names, as stand-ins: a model file, a kohya folder of images
    with captions, a tokenizer cache and an output folder."""
    model = tmp_path / "model.safetensors"
    model.write_bytes(b"0")
    img = tmp_path / "img" / "2_mytoken style"
    img.mkdir(parents=True)
    from PIL import Image

    for i in range(2):  # like the real trainer's data: 128 px images, cropped to 64 px
        Image.new("RGB", (128, 128), (i * 90, 40, 200)).save(img / f"{i}.png")
        (img / f"{i}.txt").write_text("mytoken style\n")
    (tmp_path / "tok").mkdir()
    (tmp_path / "out").mkdir()
    files = {}
    for name in ("clip_l", "t5xxl", "ae"):  # FLUX's other model files
        (tmp_path / f"{name}.safetensors").write_bytes(b"0")
        files[f"@{name.upper()}@"] = str(tmp_path / f"{name}.safetensors")
    return {"@MODEL@": str(model), "@DATA@": str(tmp_path / "img"), "@TOKCACHE@": str(tmp_path / "tok"),
            "@OUT@": str(tmp_path / "out"), **files}


def fill(src: Path, subs: dict[str, str], dest: Path) -> Path:
    text = src.read_text()
    for k, v in subs.items():
        text = text.replace(k, v)
    dest.write_text(text)
    return dest


def header(path: Path, field: str) -> str:
    m = re.search(rf"^# {field}: (.+)$", path.read_text(), re.M)
    assert m, (path, field)
    return m.group(1).strip()


def test_the_harness_config_that_trains_passes(realish, tmp_path):
    cfg = fill(DATA / "realtrainer_harness.toml", realish, tmp_path / "ok.toml")
    res = invoke("check", cfg, "--model", "sd15")
    assert res.exit_code == 0, res.output
    assert "would start training" in res.stdout
    data = json.loads(invoke("check", cfg, "--model", "sd15", "--json").stdout)
    assert data == {"ok": True, "script": "train_network.py", "problems": [], "warnings": []}


def test_there_are_refused_configs_of_many_kinds():
    # One config per rule, or per key where one rule (the dataset schema's types) refuses several.
    rules = {header(p, "rule") for p in REFUSED}
    kinds = {(header(p, "rule"), header(p, "offending")) for p in REFUSED}
    assert len(rules) >= 10 and len(kinds) == len(REFUSED)


@pytest.mark.parametrize("path", REFUSED, ids=lambda p: p.stem)
def test_each_refused_config_exits_2_naming_its_key(path, realish, tmp_path):
    cfg = fill(path, realish, tmp_path / path.name)
    key, rule = header(path, "offending"), header(path, "rule")
    res = invoke("check", cfg, "--model", "sd15")
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    # A refusal is one paragraph: its first line, then continuation lines indented under it.
    lines = res.stdout.splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("refused"))
    rest = [ln.strip() for ln in itertools.takewhile(lambda ln: ln.startswith("  "), lines[first + 1:])]
    line = " ".join([lines[first], *rest])
    assert key in line and f"[{rule}]" in line and "(" in line
    data = json.loads(invoke("check", cfg, "--model", "sd15", "--json").stdout)
    assert set(data) == {"ok", "script", "problems", "warnings"} and data["ok"] is False
    assert any(key in p["keys"] and p["where"] for p in data["problems"])
    for p in data["problems"] + data["warnings"]:
        assert set(p) == {"keys", "message", "where", "path"}
        assert p["path"] in ("config_file", "command_line", "dataset_config")


@pytest.mark.parametrize("path", FAMILY_REFUSED, ids=lambda p: f"{p.parent.name}-{p.stem}")
def test_each_family_refused_config_breaks_its_rule_alone(path, realish, tmp_path):
    """One refusal, by the rule the header names, whose line in rules.toml is the one the header
    cites (the real trainer's message is checked by tests/integration/test_check_real.py)."""
    from kohya_tuner.check import rules

    cfg = fill(path, realish, tmp_path / path.name)
    key, rule = header(path, "offending"), header(path, "rule")
    res = invoke("check", cfg, "--model", path.parent.name)
    assert res.exit_code == 2, res.output
    refusals = [ln for ln in res.stdout.splitlines() if ln.startswith("refused")]
    assert len(refusals) == 1 and f"[{rule}]" in res.stdout.replace("\n  ", " "), res.stdout
    data = json.loads(invoke("check", cfg, "--model", path.parent.name, "--json").stdout)
    assert [key in p["keys"] for p in data["problems"]] == [True], data
    (found,) = [r for r in rules() if r.id == rule]
    assert header(path, "line").split()[0] == found.line and path.parent.name in data["script"]


def test_command_line_and_gui_json_inputs_are_checked(tmp_path, realish):
    sh = tmp_path / "train.sh"
    sh.write_text(f"accelerate launch train_network.py --pretrained_model_name_or_path {realish['@MODEL@']} \\\n"
                  f"  --train_data_dir {realish['@DATA@']} --resolution 128 --network_module networks.lora \\\n"
                  "  --persistent_data_loader_workers --max_data_loader_n_workers 0\n")
    res = invoke("check", sh, "--json")
    data = json.loads(res.stdout)
    assert res.exit_code == 2 and data["script"] == "train_network.py"
    assert [p["keys"][0] for p in data["problems"]] == ["persistent_data_loader_workers"]
    gui = tmp_path / "gui.json"
    gui.write_text(json.dumps({"LoRA_type": "Standard", "sdxl": True, "network_dim": 16, "network_alpha": 8,
                               "pretrained_model_name_or_path": realish["@MODEL@"],
                               "train_data_dir": realish["@DATA@"], "max_resolution": "1024,1024",
                               "train_batch_size": 1, "sdxl_cache_text_encoder_outputs": True}))
    data = json.loads(invoke("check", gui, "--json").stdout)
    assert data["script"] == "sdxl_train_network.py" and not data["ok"]
    assert "cache_text_encoder_outputs" in [p["keys"][0] for p in data["problems"]]


def test_adjustments_are_warnings_with_exit_0(tmp_path, realish):
    cfg = fill(DATA / "realtrainer_harness.toml", realish, tmp_path / "c.toml")
    cfg.write_text(cfg.read_text() + "sample_every_n_steps = 0\nfoo_bar = 1\n")
    res = invoke("check", cfg, "--model", "sd15")
    assert res.exit_code == 0, res.output
    assert "sample_every_n_steps = 0 turns step sampling off" in res.stderr
    assert "foo_bar" in res.stderr  # unknown keys: sd-scripts ignores them, so only a warning
    data = json.loads(invoke("check", cfg, "--model", "sd15", "--json").stdout)
    assert data["ok"] and {w["keys"][0] for w in data["warnings"]} == {"sample_every_n_steps", "foo_bar"}


@pytest.mark.parametrize("n", [1, 5, 6, 7, 40])
def test_many_findings_of_one_rule_are_summed_up_past_five(n, tmp_path, realish):
    cfg = fill(DATA / "realtrainer_harness.toml", realish, tmp_path / "c.toml")
    keys = [f"zz_other_tool_setting_{i}" for i in range(n)]
    cfg.write_text(cfg.read_text() + "".join(f"{k} = {i}\n" for i, k in enumerate(keys)))
    res = invoke("check", cfg, "--model", "sd15")
    assert res.exit_code == 0, res.output
    flat = " ".join(res.stderr.split())
    one_by_one = [k for k in keys if f"warning: {k}:" in flat]
    if n <= 6:  # a summary line would save no line
        assert one_by_one == keys and "more [unknown_key]" not in flat
    else:
        assert one_by_one == keys[:5]
        assert f"and {n - 5} more [unknown_key] like those: {keys[5]}," in flat
    data = json.loads(invoke("check", cfg, "--model", "sd15", "--json").stdout)
    assert [w["keys"][0] for w in data["warnings"] if "is not an argument" in w["message"]] == keys


def test_the_dataset_file_is_checked_too(tmp_path, realish):
    ds = tmp_path / "ds.toml"
    ds.write_text(f'[[datasets]]\nbatch_size = 0\n[[datasets.subsets]]\nimage_dir = "{realish["@DATA@"]}/2_mytoken style"\n')
    cfg = fill(DATA / "realtrainer_harness.toml", realish, tmp_path / "c.toml")
    data = json.loads(invoke("check", cfg, "--model", "sd15", "--dataset-config", ds, "--json").stdout)
    assert not data["ok"] and ["datasets[0].batch_size"] in [p["keys"] for p in data["problems"]]


NOT_LORA = ["sdxl_train.py", "train_db.py", "fine_tune.py", "flux_train.py", "sd3_train.py",
            "train_textual_inversion.py", "sdxl_train_textual_inversion.py", "train_controlnet.py",
            "sdxl_train_control_net_lllite.py", "flux_train_control_net.py"]


def _estimated(script):
    from kohya_tuner.memory.finetune import family_for

    return family_for(script, None, None) is not None


@pytest.mark.parametrize("script", [s for s in NOT_LORA if not _estimated(s)])
def test_scripts_that_are_not_lora_are_named_by_check_estimate_and_fit(script, tmp_path):
    sh = tmp_path / "train.sh"
    sh.write_text(f"accelerate launch {script} --pretrained_model_name_or_path m.safetensors --learning_rate 1e-6\n")
    res = invoke("check", sh, "--json")
    data = json.loads(res.stdout)
    assert res.exit_code == 2 and data["script"] == script and "(not LoRA)" in data["problems"][0]["message"]
    for cmd in (["estimate", sh], ["fit", sh, "--gpu", "24", "--out", tmp_path / "o.toml"]):
        res = invoke(*cmd)
        assert res.exit_code == 2 and "(not LoRA)" in res.stderr and "Traceback" not in res.output
        assert not (tmp_path / "o.toml").exists()


def test_textual_inversion_and_controlnet_are_never_estimated_as_lora():
    # Full fine-tunes may have their own estimate; these scripts train something else entirely.
    assert not any(_estimated(s) for s in NOT_LORA if "textual_inversion" in s or "control" in s)


def test_a_gui_file_without_network_settings_is_read_as_a_full_fine_tune(tmp_path):
    gui = tmp_path / "db.json"
    gui.write_text(json.dumps({"sdxl": True, "learning_rate": 1e-6, "train_batch_size": 1,
                               "max_resolution": "1024,1024"}))
    data = json.loads(invoke("check", gui, "--json").stdout)
    assert data["script"] == "sdxl_train.py"
    if not _estimated("sdxl_train.py"):
        assert "(not LoRA)" in data["problems"][0]["message"]


def test_estimate_and_fit_refuse_invalid_values_instead_of_estimating_them(tmp_path):
    cases = {"train_batch_size = 0": "train_batch_size", "network_dim = -4": "network_dim",
             "network_alpha = nan": "network_alpha", "learning_rate = inf": "learning_rate",
             "max_train_steps = 9223372036854775807\ngradient_accumulation_steps = 0": "gradient_accumulation_steps"}
    for bad, key in cases.items():
        cfg = tmp_path / "c.toml"
        cfg.write_text(f'network_module = "networks.lora"\nresolution = "512"\n{bad}\n')
        for cmd in (["estimate", cfg, "--model", "sd15"],
                    ["fit", cfg, "--model", "sd15", "--gpu", "8", "--out", tmp_path / "o.toml"]):
            res = invoke(*cmd)
            assert res.exit_code == 2, (bad, cmd[0], res.output)
            assert f"{key}: " in res.stderr, res.stderr
            assert not (tmp_path / "o.toml").exists()


def test_bad_input_is_one_paragraph(tmp_path):
    res = invoke("check", tmp_path / "missing.toml")
    assert res.exit_code == 2 and res.stderr.startswith("error:") and "Traceback" not in res.output
    res = invoke("check", tmp_path / "missing.toml", "--json")
    assert res.exit_code == 2 and "error" in json.loads(res.stdout)
    empty = tmp_path / "x.toml"
    empty.write_text('learning_rate = 1e-4\n')
    res = invoke("check", empty)
    assert res.exit_code == 2 and "--model" in res.stderr


def test_check_is_listed_in_help():
    res = invoke("--help")
    assert re.search(r"^\s+check\s+", res.stdout, re.M)


@pytest.mark.parametrize("item,key", [("train_batch_size=0", "train_batch_size"), ("network_dim=-4", "network_dim"),
                                      ("learning_rate=nan", "learning_rate"), ("resolution=64", "min_bucket_reso"),
                                      ("max_data_loader_n_workers=0", "persistent_data_loader_workers")])
def test_config_refuses_a_set_that_sd_scripts_would_refuse(item, key, tmp_path):
    out = tmp_path / "plan"
    res = invoke("config", "--model", "sd15", "--job", "character", "--gpu", "12", "--out", out, "--set", item)
    assert res.exit_code == 2, res.output
    assert key in res.stderr and "Traceback" not in res.output
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("name", ["../../escape", "a/b", "..", "x\\y"])
def test_the_lora_name_cannot_leave_the_output_folder(name, tmp_path):
    out = tmp_path / "plan"
    res = invoke("config", "--model", "sd15", "--job", "character", "--gpu", "12", "--out", out, "--name", name)
    assert res.exit_code == 2 and "--name" in res.stderr
    assert not out.exists() or not any(out.iterdir())


def test_a_config_kohya_tuner_wrote_is_checked_with_the_dataset_file_beside_it(tmp_path):
    """config.toml names no dataset_config: its launch scripts pass dataset.toml beside it, so
    `check config.toml` judges that pair (it used to refuse the plan for having no images)."""
    from PIL import Image

    img = tmp_path / "img"
    img.mkdir()
    for i in range(4):
        Image.new("RGB", (512, 512), (i * 50, 40, 200)).save(img / f"{i}.png")
        (img / f"{i}.txt").write_text("tok style\n")
    (tmp_path / "model.safetensors").write_bytes(b"0")
    out = tmp_path / "run"
    res = invoke("config", "--model", "sd15", "--job", "style", "--gpu", "8", "--data", img, "--base",
                 tmp_path / "model.safetensors", "--out", out)
    assert res.exit_code == 0, res.output
    res = invoke("check", out / "config.toml")
    assert res.exit_code == 0, res.output
    assert "dataset.toml (written beside this config" in " ".join(res.stdout.split())
    assert json.loads(invoke("check", out / "config.toml", "--json").stdout)["ok"]
    # A config of the user's own with a dataset.toml beside it is not paired with it unasked.
    own = tmp_path / "own"
    own.mkdir()
    (own / "config.toml").write_text((out / "config.toml").read_text().split("\n", 1)[1])
    (own / "dataset.toml").write_text((out / "dataset.toml").read_text())
    data = json.loads(invoke("check", own / "config.toml", "--json").stdout)
    assert not data["ok"] and ["train_data_dir", "dataset_config"] in [p["keys"] for p in data["problems"]]


@pytest.mark.parametrize("script,model", [("sdxl_train.py", "sd_xl_base_1.0.safetensors"),
                                          ("train_db.py", "v1-5-pruned.safetensors")])
def test_a_fitted_full_fine_tune_is_checked_and_estimated_with_its_own_script(tmp_path, script, model):
    # No key in the fitted file is one only the fine-tune script takes: the script the plan was for is
    # what the file records, or check and estimate would read it as the family's LoRA script.
    cmd = tmp_path / "ft.sh"
    cmd.write_text(f"accelerate launch {script} --pretrained_model_name_or_path={model} --train_batch_size=1 "
                   "--mixed_precision=bf16 --learning_rate=1e-5 --gradient_checkpointing\n")
    fitted = tmp_path / "ft.toml"
    assert invoke("fit", cmd, "--gpu", "24", "--no-history", "--out", fitted).exit_code == 0
    data = json.loads(invoke("check", fitted, "--json").stdout)
    assert data["script"] == script, data
    assert not any(p["rule"] == "network_module_required" for p in data["problems"])
    est = json.loads(invoke("estimate", fitted, "--json").stdout)
    assert est["settings"]["trained"] == "full" and est["input"]["script"] == script
    # a network module the user adds since makes the file a LoRA config again, whatever was recorded
    fitted.write_text(fitted.read_text() + '\n[added]\nnetwork_module = "networks.lora"\n')
    assert json.loads(invoke("check", fitted, "--json").stdout)["script"] != script
