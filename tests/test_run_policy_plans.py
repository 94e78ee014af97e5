"""The supervisor's decision on plans `run` really makes (a dry run on the stand-in), not on
hand-written configs: what the real-trainer scenarios of tests/integration/test_real_run.py would
be answered with, decided in a second instead of launched."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kohya_tuner.run.policy import Retry, resume_unsafe
from tests.clihelp import invoke
from tests.policyhelp import decision_after_oom

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "integration"))
from harness import CPU_SETS  # noqa: E402  (the settings every real-trainer scenario runs with)


def _images(dest: Path, count: int) -> Path:
    """`count` 128 px images with captions, the size of the real-trainer harness's."""
    from PIL import Image

    dest.mkdir(parents=True)
    for i in range(count):
        Image.new("RGB", (128, 128), (20 * i, 120, 90)).save(dest / f"img_{i:02d}.png")
        (dest / f"img_{i:02d}.txt").write_text(f"mytoken, picture {i}", encoding="utf-8")
    return dest


def test_a_tiny_deficit_on_the_10gb_preset_with_accumulation_resumes_from_the_saved_state(tmp_path):
    """The plan of test_real_run's accumulation scenario (batch 2 x accumulation 2 from the 10 GB
    preset, --no-fit, the CPU harness's settings, the text encoder left out), out of memory 20 MiB
    short after step 4 with that step's state saved: a move the state can follow, and the resume."""
    images = _images(tmp_path / "img", 12)
    base = tmp_path / "base.safetensors"
    base.write_bytes(b"\0" * 64)
    out = tmp_path / "run"
    sets = [a for s in CPU_SETS if s != "gradient_accumulation_steps=1" for a in ("--set", s)]
    res = invoke("run", "--gpu", "10", "--model", "sd15", "--job", "character", "--steps", "5", "--cpu",
                 "--data", str(images), "--out", str(out), "--sd-scripts", str(REPO / "tests" / "standin"),
                 "--python", sys.executable, "--base", str(base), "--set", f"tokenizer_cache_dir={tmp_path}",
                 *sets, "--no-fit", "--set", "network_train_unet_only=true", "--dry-run")
    assert res.exit_code == 0, res.output[-3000:]
    first = (out / "attempt-1.config.toml").read_text(encoding="utf-8")
    assert "train_batch_size = 2" in first and "gradient_accumulation_steps = 2" in first
    action, saved = decision_after_oom(out, end_step=4, tried_mib=40, free_mib=20)
    assert isinstance(action, Retry), action
    assert not resume_unsafe(action.changes), (action.move, action.changes)
    assert action.resume_from == saved and action.start_step == 4, (action.move, action.note)
