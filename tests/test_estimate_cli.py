"""`kohya-tuner estimate` on real user files and on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from tests.clihelp import invoke as _invoke_cli

from kohya_tuner.memory import budget_gib
from tests.refdata import shared_path

REAL = ["01_kohya-ss_sd-scripts_648.toml", "05_bmaltais_kohya_ss_156.sh", "09_cocktailpeanut_fluxgym_360.sh",
        "11_bmaltais_kohya_ss_1184.json"]


def invoke(*args):
    return _invoke_cli(*[str(a) for a in args])


@pytest.mark.parametrize("name", REAL)
def test_estimate_json_on_every_real_config(name):
    path = shared_path("real-world", "configs", name)
    res = invoke("estimate", path, "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    for key in ("model", "peak_gib", "peak_phase", "components_gib", "phases_gib", "fits_cards", "assumptions"):
        assert key in data
    assert set(data["fits_cards"]) == {"6", "8", "10", "12", "16", "20", "24", "32", "48", "80"}
    assert data["peak_gib"] == max(data["phases_gib"].values())
    assert data["peak_phase"] in data["phases_gib"]


def test_estimate_reads_the_family_from_each_form():
    expected = {"01_kohya-ss_sd-scripts_648.toml": "sdxl", "05_bmaltais_kohya_ss_156.sh": "sd15",
                "09_cocktailpeanut_fluxgym_360.sh": "flux"}
    for name, model in expected.items():
        data = json.loads(invoke("estimate", shared_path("real-world", "configs", name), "--json").stdout)
        assert data["model"] == model


def test_model_flag_overrides_the_guess():
    path = shared_path("real-world", "configs", "11_bmaltais_kohya_ss_1184.json")
    data = json.loads(invoke("estimate", path, "--model", "sdxl", "--json").stdout)
    assert data["model"] == "sdxl"


def test_table_output_names_the_peak_and_the_gpu(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('mixed_precision = "bf16"\nnetwork_module = "networks.lora_flux"\nfp8_base = true\n'
                   'gradient_checkpointing = true\ncache_latents = true\ncache_text_encoder_outputs = true\n'
                   'network_train_unet_only = true\nresolution = "512"\n')
    res = invoke("estimate", cfg, "--gpu", "16")
    assert res.exit_code == 0, res.output
    assert "peak" in res.stdout and "16 GB" in res.stdout and "fits" in res.stdout


def test_dataset_option_changes_the_estimate(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('mixed_precision = "bf16"\nnetwork_module = "networks.lora"\nsdpa = true\nresolution = "512"\n',
                   encoding="utf-8")
    ds = tmp_path / "d.toml"
    ds.write_text('[general]\nresolution = 1024\nbatch_size = 2\n[[datasets]]\n[[datasets.subsets]]\n'
                  'image_dir = "x"\n', encoding="utf-8")
    plain = json.loads(invoke("estimate", cfg, "--model", "sdxl", "--json").stdout)
    with_ds = json.loads(invoke("estimate", cfg, "--model", "sdxl", "--dataset", ds, "--json").stdout)
    assert with_ds["peak_gib"] > plain["peak_gib"]
    assert with_ds["settings"]["batch"] == 2


@pytest.mark.parametrize("content,suffix", [
    ("this is = = not toml [", ".toml"),
    ("{\"broken\": ", ".json"),
    ("", ".toml"),
    ("python not_a_training_script.py --foo 1", ".sh"),
])
def test_unreadable_input_is_exit_2_without_traceback(tmp_path, content, suffix):
    p = tmp_path / f"bad{suffix}"
    p.write_text(content, encoding="utf-8")
    res = subprocess.run([sys.executable, "-m", "kohya_tuner", "estimate", str(p)], capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "200"})
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and "error:" in res.stderr


def test_missing_file_and_unknown_family(tmp_path):
    assert invoke("estimate", tmp_path / "nope.toml").exit_code == 2
    p = tmp_path / "c.toml"
    p.write_text('learning_rate = 0.0001\n', encoding="utf-8")
    res = invoke("estimate", p)
    assert res.exit_code == 2 and "--model" in res.output
    assert invoke("estimate", p, "--model", "sd4").exit_code == 2
    assert invoke("estimate", p, "--model", "sd15", "--gpus", "0").exit_code == 2


def test_gpu_auto_subtracts_other_processes_and_applies_history(tmp_path, monkeypatch):
    from kohya_tuner import history
    from kohya_tuner.cli import cmd_estimate
    from kohya_tuner.gpu import GpuChoice, GpuInfo, GpuProcess

    info = GpuInfo(index=0, name="NVIDIA GeForce RTX 3060", total_gib=12.0, free_gib=10.5, used_gib=1.5,
                   compute_capability=(8, 6), processes=(GpuProcess(pid=99999, name="Xorg", used_gib=1.5),))
    monkeypatch.setattr("kohya_tuner.gpu.choose", lambda text, index=0: GpuChoice(gb=12, info=info))
    cfg = tmp_path / "c.toml"
    cfg.write_text('mixed_precision = "bf16"\nnetwork_module = "networks.lora"\nsdpa = true\n'
                   'gradient_checkpointing = true\nresolution = "1024"\n', encoding="utf-8")
    plain = json.loads(invoke("estimate", cfg, "--model", "sdxl", "--json").stdout)
    history.append({"gpu_name": info.name, "model": "sdxl", "predicted_gib": 10.0, "measured_peak_gib": 11.0})
    auto = json.loads(invoke("estimate", cfg, "--model", "sdxl", "--gpu", "auto", "--json").stdout)
    assert auto["gpu"]["others_gib"] == 1.5
    assert auto["gpu"]["budget_gib"] == pytest.approx(budget_gib(12) - 1.5, abs=1e-3)
    assert auto["peak_gib"] == pytest.approx(plain["peak_gib"] * 1.1, abs=2e-3)
    assert any(a.startswith("scaled by") for a in auto["assumptions"])
    no_hist = json.loads(invoke("estimate", cfg, "--model", "sdxl", "--gpu", "auto", "--no-history", "--json").stdout)
    assert no_hist["peak_gib"] == plain["peak_gib"]
