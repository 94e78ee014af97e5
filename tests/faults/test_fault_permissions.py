"""Permissions are never widened: a file written over another keeps its mode (fit
--force over a 0600 config stays 0600), and `dataset prep` gives each copy the mode of
its source (of a link's target), as `cp` does."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from PIL import Image

from kohya_tuner import dataset, fileio
from tests.clihelp import invoke

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o644, 0o400])
def test_a_replaced_file_keeps_its_mode(tmp_path, mode):
    p = tmp_path / "c.toml"
    p.write_text("old\n")
    p.chmod(mode)
    fileio.write_new(p, "new\n", force=True)
    assert p.read_text() == "new\n" and _mode(p) == mode
    assert _mode(tmp_path / "c.toml.bak") == mode  # the backup is the same file
    fileio.atomic_write(p, "newer\n")
    assert _mode(p) == mode


def test_a_replaced_script_stays_executable_only_for_its_readers(tmp_path):
    p = tmp_path / "launch.sh"
    p.write_text("old\n")
    p.chmod(0o700)
    fileio.write_new(p, "new\n", force=True, executable=True)
    assert _mode(p) == 0o700
    p.chmod(0o640)
    fileio.write_new(p, "newer\n", force=True, executable=True)
    assert _mode(p) == 0o750


def test_fit_force_over_a_private_config_keeps_it_private(tmp_path):
    cfg = tmp_path / "in.toml"
    cfg.write_text('pretrained_model_name_or_path = "/m.safetensors"\nnetwork_module = "networks.lora"\n'
                   'train_data_dir = "/d"\nresolution = "512"\ntrain_batch_size = 8\nnetwork_dim = 128\n'
                   'output_dir = "/o"\noutput_name = "x"\n', encoding="utf-8")
    out = tmp_path / "fitted.toml"
    out.write_text("# mine\n")
    out.chmod(0o600)
    res = invoke("fit", cfg, "--gpu", "6", "--out", out, "--force")
    if res.exit_code != 0 or out.read_text() == "# mine\n":
        pytest.skip(f"fit wrote nothing here: {res.output[-200:]}")
    assert _mode(out) == 0o600


def test_prep_copies_take_the_mode_of_their_source_and_a_links_target(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        Image.new("RGB", (512, 512), (40 * i, 20, 20)).save(src / f"i{i}.png")
    (src / "i0.txt").write_text("private caption")
    (src / "i0.txt").chmod(0o600)
    (src / "i0.png").chmod(0o600)
    secret = tmp_path / "elsewhere.txt"
    secret.write_text("linked caption")
    secret.chmod(0o600)
    (src / "i1.txt").symlink_to(secret)
    (src / "i2.txt").write_text("open caption")
    (src / "i2.txt").chmod(0o644)
    out = tmp_path / "out"
    dataset.prepare(src, out, "sd15", workers=1)
    produced = {p.name: _mode(p) for p in out.rglob("*") if p.is_file() and p.stem in ("i0", "i1", "i2")}
    assert produced["i0.txt"] == 0o600 and produced["i1.txt"] == 0o600
    assert produced["i0.png"] == 0o600
    assert produced["i2.txt"] == 0o644 & fileio.default_mode()
