"""Values the pinned trainer refuses or breaks on are refused before anything is written,
with exit 2 and the key named; their neighbours that work are still accepted (a false
refusal is as bad as a miss). The sd-scripts line behind each is in the rule's `line`."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from tests.clihelp import invoke

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "standin"


@pytest.fixture()
def data(tmp_path):
    d = tmp_path / "imgs"
    d.mkdir()
    for i in range(3):
        Image.new("RGB", (512, 512), (30 * i, 90, 10)).save(d / f"i{i}.png")
    return d


def _config(data, out, *sets, model="sd15"):
    args = ["config", "-m", model, "-j", "style", "--gpu", "12", "--data", data, "--out", out]
    for s in sets:
        args += ["--set", s]
    return invoke(*args)


@pytest.mark.parametrize("bad, good, key", [
    ("clip_skip=100", "clip_skip=2", "clip_skip"),
    ("clip_skip=14", "clip_skip=13", "clip_skip"),
    ("network_module=os.system", "network_module=lycoris.kohya", "network_module"),
    ("network_module=subprocess", "network_module=networks.dylora", "network_module"),
])
def test_refused_with_the_key_named_and_the_neighbour_accepted(tmp_path, data, bad, good, key):
    res = _config(data, tmp_path / "bad", bad)
    assert res.exit_code == 2 and key in res.output, res.output
    assert not (tmp_path / "bad" / "config.toml").exists()
    res = _config(data, tmp_path / "good", good)
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("repeats, code", [("9223372036854775807", 2), ("1000000000", 2), ("1000001", 2),
                                           ("1000000", 0), ("20", 0)])
def test_a_folder_asking_for_absurd_repeats_is_refused(tmp_path, repeats, code):
    d = tmp_path / "imgs" / f"{repeats}_x"
    d.mkdir(parents=True)
    Image.new("RGB", (512, 512)).save(d / "a.png")
    res = _config(tmp_path / "imgs", tmp_path / "o")
    assert res.exit_code == code, res.output
    if code == 2:
        assert "num_repeats" in res.output


@pytest.mark.parametrize("minutes, code", [("1e-9", 2), ("0", 2), ("0.01", 2), ("0.05", 0), ("30", 0)])
def test_hang_timeout_shorter_than_a_start_is_refused(tmp_path, data, minutes, code):
    base = tmp_path / "b.safetensors"
    base.write_bytes(b"\0" * 64)
    res = invoke("run", "-m", "sd15", "-j", "style", "--gpu", "8", "--cpu", "--data", data, "--out", tmp_path / "o",
                 "--sd-scripts", STANDIN, "--steps", "4", "--base", base, "--dry-run", "--hang-timeout", minutes)
    assert res.exit_code == code, res.output
    if code == 2:
        assert "--hang-timeout" in res.output


def test_a_value_the_fit_rewrites_is_said_not_silent(tmp_path, data):
    res = _config(data, tmp_path / "o", "train_batch_size=100000")
    assert res.exit_code == 0, res.output
    assert "train_batch_size = 100000 from --set was changed to" in " ".join(res.output.split())
