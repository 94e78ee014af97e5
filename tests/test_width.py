"""Plain-text output at 80, 100 and 160 columns: every line fits or is one unbreakable word
(a path or a command to copy)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

EXE = [sys.executable, "-m", "kohya_tuner"]


def _over(text: str, cols: int) -> list[str]:
    return [ln for ln in text.splitlines() if len(ln) > cols and len(ln.split()) > 1
            and not any(len(w) > cols // 2 for w in ln.split())]


def _run(cols: int, *args):
    return subprocess.run([*EXE, *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": str(cols)})


@pytest.mark.parametrize("cols", [80, 100, 160])
def test_top_level_help_and_refusals_fit_the_terminal(cols, tmp_path):
    res = _run(cols, "--help")
    assert res.returncode == 0 and _over(res.stdout, cols) == []
    # A refusal: SD 3.5 Large on 6 GB, and a dataset that cannot be trained on.
    res = _run(cols, "config", "--model", "sd35l", "--job", "style", "--gpu", "6", "--out", tmp_path / "a")
    assert res.returncode == 2 and _over(res.stderr, cols) == [], res.stderr
    data = tmp_path / "d"
    data.mkdir()
    (data / "a.png").write_bytes(b"not an image")
    res = _run(cols, "config", "--model", "sdxl", "--job", "style", "--gpu", "12", "--data", data,
               "--out", tmp_path / "b")
    assert res.returncode == 2 and _over(res.stderr, cols) == [], res.stderr
    assert len(res.stderr.splitlines()) > 1 or len(res.stderr) <= cols


@pytest.mark.parametrize("cols", [80, 100, 160])
def test_fit_changes_fit_the_terminal_without_cutting_values(cols, tmp_path):
    res = _run(200, "config", "--model", "sdxl", "--job", "style", "--gpu", "24", "--out", tmp_path / "c", "--no-fit")
    assert res.returncode == 0, res.stderr
    res = _run(cols, "fit", tmp_path / "c" / "config.toml", "--gpu", "6", "--out", tmp_path / "f.toml")
    assert res.returncode == 0, res.stderr
    assert _over(res.stdout, cols) == [] and "…" not in res.stdout
    assert "train_batch_size" in res.stdout and "4 → 1" in res.stdout


@pytest.mark.parametrize("cols", [80, 100, 160])
def test_estimate_assumptions_wrap_at_words(cols, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('network_module = "networks.lora"\nnetwork_dim = 16\n')
    res = _run(cols, "estimate", cfg, "--model", "sdxl", "--gpu", "12")
    assert res.returncode == 0, res.stderr
    assert "Assumed" in res.stdout and _over(res.stdout, cols) == []


@pytest.mark.parametrize("cols", [80, 100, 160])
def test_dataset_prep_summary_wraps_at_words(cols, tmp_path):
    from PIL import Image

    data = tmp_path / "d"
    data.mkdir()
    for i in range(3):
        Image.new("RGB", (512, 512), (i, 2, 3)).save(data / f"{i}.png")
    res = _run(cols, "dataset", "prep", data, "--out", tmp_path / "p", "-m", "sdxl")
    assert res.returncode == 0, res.stderr
    assert "copied unchanged" in res.stdout and _over(res.stdout, cols) == []


@pytest.mark.parametrize("cols", [80, 100, 160])
def test_diagnose_advice_wraps_at_words(cols, tmp_path):
    log = tmp_path / "oom.log"
    log.write_text("steps:  10%|█         | 100/1000 [01:00<09:00, 1.67it/s, avr_loss=0.1]\n"
                   "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                   "capacity of 11.76 GiB of which 1.06 GiB is free. Of the allocated memory 9.50 GiB is allocated "
                   "by PyTorch, and 0.50 GiB is reserved by PyTorch but unallocated.\n")
    res = _run(cols, "diagnose", log)
    assert "What to do" in res.stdout and _over(res.stdout, cols) == [], res.stdout


@pytest.mark.parametrize("cols", [80, 100, 160])
def test_check_refusals_and_verdicts_wrap_at_words(cols, tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('network_module = "networks.lora"\ncache_text_encoder_outputs = true\nshuffle_caption = true\n'
                   'learning_rate = "abc"\nnetwork_dim = 16\n')
    res = _run(cols, "check", cfg)
    assert res.returncode == 2 and "refused" in res.stdout
    assert _over(res.stdout, cols) == [] and _over(res.stderr, cols) == [], res.stdout
    # Each refusal still starts its own line, its continuation indented under it.
    assert all(ln.startswith(("refused ", "  ")) for ln in res.stdout.splitlines()[:-2])


@pytest.mark.parametrize("cols", [80, 100, 160])
def test_dataset_check_summary_lines_wrap_at_words(cols, tmp_path):
    from PIL import Image

    data = tmp_path / "d"
    data.mkdir()
    for i in range(3):
        Image.new("RGB", (1024, 1024), (i, 2, 3)).save(data / f"{i}.png")
    Image.new("RGB", (20, 300)).save(data / "thin.png")
    (data / "x.jpg").write_bytes(b"\xff\xd8\xff\xe0" + b"0" * 50)
    res = _run(cols, "dataset", "check", data, "--job", "character", "--model", "sdxl", "--trigger", "ohwx")
    assert "judged for character" in res.stdout and "failure(s)" in res.stdout
    assert _over(res.stdout, cols) == [] and _over(res.stderr, cols) == [], res.stdout


@pytest.mark.parametrize("cols", [80, 100, 160])
def test_config_and_dry_run_plans_fit_the_terminal(cols, tmp_path):
    from PIL import Image

    data = tmp_path / "d"
    data.mkdir()
    for i in range(12):
        Image.effect_noise((768, 768), 30 + i).convert("RGB").save(data / f"{i}.png")
        (data / f"{i}.txt").write_text(f"ohwx, pose {i}")
    res = _run(cols, "config", "--model", "sdxl", "--job", "character", "--gpu", "12", "--data", data,
               "--trigger", "ohwx", "--base", tmp_path / "missing.safetensors", "--out", tmp_path / "c")
    assert res.returncode == 0 and "Length:" in res.stdout
    assert _over(res.stdout, cols) == [] and _over(res.stderr, cols) == [], res.stdout + res.stderr
    res = _run(cols, "run", "--dry-run", "--model", "sdxl", "--job", "character", "--gpu", "12", "--data", data,
               "--base", tmp_path / "missing.safetensors", "--out", tmp_path / "r")
    assert res.returncode == 0, res.stderr
    # The launch command is one line on purpose: it is there to be copied into a shell.
    lines = [ln for ln in res.stdout.splitlines() if "accelerate.commands.launch" not in ln]
    assert "Length:" in res.stdout and _over("\n".join(lines), cols) == [] and _over(res.stderr, cols) == []


@pytest.mark.parametrize("cols", [80, 100, 160])
def test_setup_verifying_a_checkout_and_doctor_fit_the_terminal(cols, tmp_path):
    from tests.test_sdscripts import make_fake_sd_scripts

    checkout = make_fake_sd_scripts(tmp_path / "sd-scripts")
    env_home = {"KOHYA_TUNER_HOME": str(tmp_path / "home")}
    res = subprocess.run([*EXE, "setup", "--sd-scripts", str(checkout)], capture_output=True, text=True,
                         env={**os.environ, **env_home, "COLUMNS": str(cols)})
    assert res.returncode == 0, res.stderr
    assert "entry scripts" in res.stdout and "differs from the pin" in res.stdout
    assert _over(res.stdout, cols) == [] and _over(res.stderr, cols) == [], res.stdout
    res = subprocess.run([*EXE, "doctor", "--sd-scripts", str(checkout)], capture_output=True, text=True,
                         env={**os.environ, **env_home, "COLUMNS": str(cols)})
    assert "warning(s)" in res.stdout or "problem(s)" in res.stdout or "Ready" in res.stdout, res.stdout
    assert _over(res.stdout, cols) == [] and _over(res.stderr, cols) == [], res.stdout
