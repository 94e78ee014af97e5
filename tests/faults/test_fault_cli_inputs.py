"""Inputs and places that used to end in a traceback or a wrong message: each is one
clear paragraph with exit 2, and nothing the user owns changes."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest
from PIL import Image

from tests.faults.conftest import fill
from kohya_tuner.errors import UserError
from tests.clihelp import invoke


def _images(folder: Path, n: int = 4, side: int = 600) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.new("RGB", (side, side - 100), (i * 40, 90, 10)).save(folder / f"img{i}.png")
        (folder / f"img{i}.txt").write_text(f"ohwx photo {i}\n")
    return folder


def _hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _clean_refusal(res, *needles: str) -> None:
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    text = " ".join(res.output.split())
    for needle in needles:
        assert needle in text, text


@pytest.mark.parametrize("flag", ["--resolution", "--min-bucket", "--max-bucket"])
@pytest.mark.parametrize("value", ["-512", "0", "nan", "1e400"])
def test_dataset_check_refuses_impossible_sides(flag, value, tmp_path):
    res = invoke("dataset", "check", _images(tmp_path / "imgs"), "--model", "sd15", flag, value)
    _clean_refusal(res, flag)


@pytest.mark.parametrize("value", [-512, 0, 10**9])
def test_bucket_planning_refuses_impossible_sides_itself(value, tmp_path):
    """The domain function, not only the CLI flag parser, refuses (no ZeroDivisionError
    for a caller that bypasses argparse)."""
    from kohya_tuner.dataset import check, guidance
    from kohya_tuner.families import get_family

    with pytest.raises(UserError, match="--resolution"):
        guidance.planned_buckets(get_family("sd15"), value)
    with pytest.raises(UserError):
        check(_images(tmp_path / "imgs"), job=None, family="sd15", resolution=value)


def test_dataset_prep_into_a_read_only_folder(tmp_path, make_readonly):
    src = _images(tmp_path / "imgs")
    before = _hashes(src)
    out = make_readonly(tmp_path / "ro") / "copy"
    res = invoke("dataset", "prep", src, "--model", "sd15", "--out", out)
    _clean_refusal(res, "Cannot write the prepared copy", "read-only", "originals are untouched")
    assert _hashes(src) == before


def test_dataset_prep_onto_a_disk_that_fills(tmp_path, tiny_disk):
    """A real full filesystem mid-copy: prep stops with one paragraph (not every image
    listed as failed), leaves no temporary files, and once there is room it finishes."""
    src = _images(tmp_path / "imgs", n=24, side=196)
    for p in src.glob("*.png"):  # incompressible pixels: with its caption ~12 KB on tmpfs per image
        Image.frombytes("RGB", (40, 40), os.urandom(40 * 40 * 3)).save(p)
    before = _hashes(src)
    fill(tiny_disk, leave=120_000)  # room for about half of them
    res = invoke("dataset", "prep", src, "--model", "sd15", "--out", tiny_disk / "copy", "--workers", "1")
    _clean_refusal(res, "Cannot write the prepared copy", "the disk is full", "free some space")
    assert "failed" not in res.output
    assert _hashes(src) == before
    assert not [p for p in (tiny_disk / "copy").rglob("*") if p.name.endswith(".kt-tmp")]
    (tiny_disk / ".filler").unlink()
    res = invoke("dataset", "prep", src, "--model", "sd15", "--out", tiny_disk / "copy", "--workers", "1")
    assert res.exit_code == 0, res.output
    assert len(list((tiny_disk / "copy").glob("*.png"))) == 24


def test_doctor_python_pointing_at_a_folder_says_so(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    res = invoke("doctor", "--python", tmp_path)
    _clean_refusal(res, f"--python {tmp_path} is a folder, not a Python executable")
    assert "does not exist" not in res.output
    (venv / "bin" / "python").symlink_to(sys.executable)
    res = invoke("doctor", "--python", venv)
    _clean_refusal(res, "is a folder", f"Did you mean {venv / 'bin' / 'python'}?")


MARKUP = ["[/red]", "[bold]", "[/]", "[link=x]"]


@pytest.mark.parametrize("tag", MARKUP)
def test_paths_with_markup_print_literally(tag, tmp_path):
    """Rich markup in a path is text: the right file is named, and no MarkupError."""
    missing = tmp_path / f"{tag}x.toml"
    res = invoke("estimate", missing)
    _clean_refusal(res, f"{missing} does not exist")
    res = invoke("diagnose", tmp_path / f"{tag}.log")
    _clean_refusal(res, str(tmp_path / f"{tag}.log"))
    folder = _images(tmp_path / f"imgs{tag}")
    res = invoke("dataset", "check", folder, "--model", "sd15")
    assert res.exit_code == 0 and str(folder) in " ".join(res.output.split()), res.output
    res = invoke("dataset", "check", tmp_path / f"gone{tag}", "--model", "sd15")
    _clean_refusal(res, f"{tmp_path / f'gone{tag}'} does not exist")
