from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import toml

from kohya_tuner import config_io, schema

EXE = [sys.executable, "-m", "kohya_tuner"]


def run(*args, cwd=None):
    return subprocess.run([*EXE, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "COLUMNS": "200"})


@pytest.mark.parametrize("model", ["sd15", "sdxl", "flux"])
@pytest.mark.parametrize("job", ["character", "style", "concept"])
@pytest.mark.parametrize("gb", [6, 8, 12, 16, 24])
def test_config_json_for_every_model_job_and_class(model, job, gb, tmp_path):
    from tests.clihelp import invoke as _invoke_cli

    out = tmp_path / "run"
    res = _invoke_cli(*["config", "--model", model, "--job", job, "--gpu", str(gb), "--out", str(out),
                                   "--json"])
    if res.exit_code == 2 and model == "flux" and gb == 6:
        assert "fit" in res.output or "GB" in res.output
        return
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    for key in ("model", "job", "gpu_gb", "script", "config", "dataset", "files"):
        assert key in data
    assert data["model"] == model and data["gpu_gb"] == gb
    cfg_text = Path(data["files"]["config.toml"]).read_text()
    config = config_io.flatten(toml.loads(cfg_text))
    assert config == data["config"]
    assert schema.errors_only(schema.validate_config(config, data["script"])) == []
    dataset = toml.loads(Path(data["files"]["dataset.toml"]).read_text())
    assert schema.validate_dataset(dataset) == [] and dataset == data["dataset"]
    launch = Path(data["files"]["launch.sh"]).read_text()
    assert data["script"] in launch and "--dataset_config" in launch and os.access(data["files"]["launch.sh"], os.X_OK)


def test_config_writes_real_paths_and_explains(tmp_path):
    data = tmp_path / "my images"
    data.mkdir()
    base = tmp_path / "sd_xl_base_1.0.safetensors"
    res = run("config", "--model", "sdxl", "--job", "style", "--gpu", "12", "--base", base, "--data", data,
              "--name", "mystyle", "--out", tmp_path / "runs" / "mystyle", "--trigger", "mystyle")
    assert res.returncode == 0, res.stderr
    assert "network_dim" in res.stdout and "job:style" in res.stdout
    cfg = config_io.read_config(tmp_path / "runs" / "mystyle" / "config.toml").config
    assert cfg["pretrained_model_name_or_path"] == str(base) and cfg["output_name"] == "mystyle"
    ds = toml.loads((tmp_path / "runs" / "mystyle" / "dataset.toml").read_text())
    assert ds["datasets"][0]["subsets"][0]["image_dir"] == str(data)
    assert ds["datasets"][0]["subsets"][0]["class_tokens"] == "mystyle"


def test_existing_files_are_refused_then_backed_up_with_force(tmp_path):
    out = tmp_path / "o"
    assert run("config", "--model", "sd15", "--job", "style", "--gpu", "8", "--out", out).returncode == 0
    (out / "config.toml").write_text("# my edits\n")
    res = run("config", "--model", "sd15", "--job", "style", "--gpu", "8", "--out", out)
    assert res.returncode == 2 and "Traceback" not in res.stderr and "--force" in res.stderr
    assert (out / "config.toml").read_text() == "# my edits\n"
    res = run("config", "--model", "sd15", "--job", "style", "--gpu", "8", "--out", out, "--force")
    assert res.returncode == 0
    assert (out / "config.toml.bak").read_text() == "# my edits\n"


def test_config_twice_with_the_same_arguments_leaves_every_file_unchanged(tmp_path):
    out = tmp_path / "o"
    args = ("config", "--model", "sd15", "--job", "style", "--gpu", "8", "--out", out)
    assert run(*args).returncode == 0
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    assert b"\r\n" in before["launch.bat"][0]  # the CRLF file a text comparison misread as changed
    res = run(*args)
    assert res.returncode == 0, res.stderr
    assert "Unchanged" in res.stdout and "Wrote:" not in res.stdout
    assert all(str(out / name) in res.stdout.split("Unchanged", 1)[1] for name in before)
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()} == before


def test_a_crlf_file_differing_only_in_line_ends_is_refused(tmp_path):
    from kohya_tuner import fileio
    from kohya_tuner.errors import UserError

    target = tmp_path / "launch.bat"
    target.write_bytes(b"@echo off\nrem\n")
    with pytest.raises(UserError):
        fileio.write_new(target, "@echo off\r\nrem\r\n")
    assert fileio.write_new(target, "@echo off\nrem\n") is None
    assert target.read_bytes() == b"@echo off\nrem\n"


@pytest.mark.parametrize("args,needle", [
    (["--model", "sd4", "--job", "style", "--gpu", "8"], "model family"),
    (["--model", "sdxl", "--job", "portrait", "--gpu", "8"], "job"),
    (["--model", "sdxl", "--job", "style", "--gpu", "3"], "below 4"),
    (["--model", "sdxl", "--job", "style", "--gpu", "twelve"], "number of GB"),
    (["--model", "sdxl", "--job", "style", "--gpu", "auto"], "NVIDIA"),
    (["--model", "sdxl", "--job", "style", "--gpu", "8", "--data", "/nonexistent/images"], "does not exist"),
    (["--model", "sdxl", "--job", "style", "--gpu", "8", "--set", "network_dimm=4"], "network_dim"),
    (["--model", "sdxl", "--job", "style", "--gpu", "8", "--set", "mixed_precision=fp32"], "mixed_precision"),
    (["--model", "sdxl", "--job", "style", "--gpu", "8", "--t5xxl", "t5.safetensors"], "does not use"),
])
def test_bad_input_is_one_paragraph_and_exit_2(args, needle, tmp_path):
    res = run("config", *args, "--out", tmp_path / "o")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    assert needle.lower() in res.stderr.lower()
    assert not (tmp_path / "o" / "config.toml").exists()


def test_malformed_preset_reports_position(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text("[settings]\nnetwork_dim = 4\nlearning_rate = \n")
    res = run("config", "--model", "sd15", "--job", "style", "--gpu", "8", "--out", tmp_path / "o", "--preset", p)
    assert res.returncode == 2 and "line 3" in res.stderr and "Traceback" not in res.stderr


def test_help_reads_well():
    res = run("--help")
    assert res.returncode == 0 and "config" in res.stdout
    res = run("config", "--help")
    assert res.returncode == 0 and "--gpu" in res.stdout and "--set" in res.stdout


def test_core_commands_do_not_import_torch(tmp_path):
    code = ("import sys; from kohya_tuner.cli.app import run; "
            "[run([c, '--help']) for c in ('config', 'estimate', 'fit', 'diagnose')]; "
            "assert not any(m.split('.')[0] in ('torch','accelerate','diffusers') for m in sys.modules), "
            "sorted(m for m in sys.modules if m.startswith(('torch','accelerate','diffusers')))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_config_data_says_what_run_data_says_about_the_captions(tmp_path):
    # The trigger is the dataset's class_tokens, which sd-scripts uses only for an image without a caption
    # file: captions that lack it never show it to the LoRA, and config says so as run --data does.
    from PIL import Image

    from tests.clihelp import invoke as _invoke

    def invoke(*args):
        return _invoke(*[str(a) for a in args])

    data = tmp_path / "imgs"
    data.mkdir()
    for i in range(3):
        Image.new("RGB", (1024, 1024), (i * 60, 9, 9)).save(data / f"{i}.png")
        (data / f"{i}.txt").write_text("a woman with red hair", encoding="utf-8")
    res = invoke("config", "--model", "sdxl", "--job", "character", "--gpu", "12", "--trigger", "ohwx",
                 "--data", data, "--out", tmp_path / "o", "--json")
    assert res.exit_code == 0, res.output
    warnings = json.loads(res.stdout)["warnings"]
    assert any("without the trigger word" in w for w in warnings), warnings
    for i in range(3):
        (data / f"{i}.txt").write_text("ohwx, a woman with red hair", encoding="utf-8")
    res = invoke("config", "--model", "sdxl", "--job", "character", "--gpu", "12", "--trigger", "ohwx",
                 "--data", data, "--out", tmp_path / "o2", "--json")
    assert not any("without the trigger word" in w for w in json.loads(res.stdout)["warnings"])
