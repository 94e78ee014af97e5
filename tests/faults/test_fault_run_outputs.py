"""Nothing is written outside --out: every setting that names a place sd-scripts writes to
(outpaths.NAME_KEYS joined onto a folder, outpaths.PATH_KEYS folders and files) is
confined, from --set, from a preset and from a config given to fit; and names too long
for the filesystem are refused before launch. Every refusal is exit 2 naming the key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from PIL import Image

from kohya_tuner import outpaths
from tests.clihelp import invoke

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "standin"

ESCAPES = ["../../x", "../x", "a/b", "..\\x", "/tmp/x"]
BAD_NAMES = ["", ".", "..", "a" * 300]  # --set strips spaces around a value


@pytest.fixture()
def data(tmp_path):
    d = tmp_path / "imgs"
    d.mkdir()
    for i in range(3):
        Image.new("RGB", (512, 512), (30 * i, 90, 10)).save(d / f"i{i}.png")
    base = tmp_path / "base.safetensors"
    base.write_bytes(b"\0" * 64)
    return {"images": d, "base": base, "root": tmp_path}


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _config(data, out, *sets):
    args = ["config", "-m", "sd15", "-j", "style", "--gpu", "12", "--data", data["images"], "--out", out,
            "--base", data["base"]]
    for s in sets:
        args += ["--set", s]
    return invoke(*args)


def _run(data, out, *extra):
    return invoke("run", "-m", "sd15", "-j", "style", "--gpu", "8", "--cpu", "--data", data["images"], "--out", out,
                  "--sd-scripts", STANDIN, "--steps", "4", "--base", data["base"], "--dry-run", *extra)


def _cases():
    for key in outpaths.NAME_KEYS:
        for v in ESCAPES + BAD_NAMES:
            yield key, v
    for key in outpaths.PATH_KEYS:
        for v in ["/tmp/elsewhere", "../outside", "~/x"]:
            yield key, v


@pytest.mark.parametrize("key, value", list(_cases()))
@pytest.mark.parametrize("command", ["config", "run"])
def test_every_output_setting_is_confined_to_out(data, key, value, command):
    root = data["root"]
    out = root / "o"
    seen = _listing(root)
    res = (_config if command == "config" else _run)(data, out, *([f"{key}={value}"] if command == "config"
                                                                  else ["--set", f"{key}={value}"]))
    assert res.exit_code == 2, res.output
    assert key in res.output and "Traceback" not in res.output
    new = _listing(root) - seen
    # At most the run lock's folder; no plan file, no output folder anywhere.
    assert all(p == "o" or p.startswith("o/.kohya-tuner") for p in new), new


def test_a_preset_output_name_is_confined_too(data, tmp_path):
    preset = tmp_path / "p.toml"
    preset.write_text('[settings]\noutput_name = "../../escaped"\n', encoding="utf-8")
    res = invoke("config", "-m", "sd15", "-j", "style", "--gpu", "12", "--data", data["images"], "--out",
                 tmp_path / "o", "--base", data["base"], "--preset", preset)
    assert res.exit_code == 2 and "output_name" in res.output, res.output
    assert not list(tmp_path.parent.glob("escaped*"))


@pytest.mark.parametrize("name", ["a" * 300, "ü" * 120])
def test_a_name_too_long_for_the_filesystem_is_refused_before_launch(data, name):
    res = _run(data, data["root"] / "o", "--name", name)
    assert res.exit_code == 2 and ("--name" in res.output or "output_name" in res.output), res.output
    assert not (data["root"] / "o" / "config.toml").exists()


def test_the_longest_plain_name_still_plans(data):
    limit = outpaths.NAME_MAX - outpaths.LONGEST_SUFFIX
    res = _run(data, data["root"] / "o", "--name", "n" * limit)
    assert res.exit_code == 0, res.output
    # Every name run and sd-scripts derive from it fits the filesystem.
    derived = "n" * limit + "-attempt100-step00000000.safetensors"
    assert len(derived) <= 255
    (data["root"] / "o" / "output").mkdir(exist_ok=True)
    (data["root"] / "o" / "output" / derived).write_bytes(b"")


def test_plain_names_and_folders_inside_out_are_accepted(data):
    out = data["root"] / "o"
    res = _config(data, out, "output_name=my_lora-v2", f"logging_dir={out / 'logs'}", "log_prefix=style_")
    assert res.exit_code == 0, res.output


def test_fit_refuses_an_escaping_output_name_in_the_users_config(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('pretrained_model_name_or_path = "/m.safetensors"\nnetwork_module = "networks.lora"\n'
                   'output_dir = "/somewhere/of/mine"\noutput_name = "../../x"\ntrain_data_dir = "/d"\n'
                   'resolution = "512"\n', encoding="utf-8")
    res = invoke("fit", cfg, "--gpu", "12", "--out", tmp_path / "f.toml")
    assert res.exit_code == 2 and "output_name" in res.output, res.output
    # The user's own output_dir outside any --out is theirs to choose: fit keeps it.
    cfg.write_text(cfg.read_text().replace('"../../x"', '"mine"'), encoding="utf-8")
    res = invoke("fit", cfg, "--gpu", "12", "--out", tmp_path / "f.toml")
    assert "output_dir" not in res.output or res.exit_code != 2, res.output


@pytest.mark.parametrize("out", ["x.json", "x", "x.TOML", "x.toml.bak"])
def test_fit_out_must_end_in_toml_as_sd_scripts_reads_it(tmp_path, out):
    cfg = tmp_path / "c.toml"
    cfg.write_text('pretrained_model_name_or_path = "/m.safetensors"\n', encoding="utf-8")
    res = invoke("fit", cfg, "--gpu", "12", "--out", tmp_path / out)
    assert res.exit_code == 2 and ".toml" in res.output, res.output
    assert not (tmp_path / out).exists()


@pytest.mark.parametrize("command", ["config", "fit", "run"])
def test_an_empty_out_is_refused_not_the_current_folder(tmp_path, command, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = {"config": ["config", "-m", "sd15", "-j", "style", "--gpu", "12"],
            "fit": ["fit", "c.toml", "--gpu", "12"],
            "run": ["run", "-m", "sd15", "-j", "style", "--gpu", "8", "--data", "."]}[command]
    res = invoke(*args, "--out", "")
    assert res.exit_code == 2 and "--out" in res.output, res.output
    assert os.listdir(tmp_path) == []
