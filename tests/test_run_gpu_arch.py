"""`run --gpu N --gpu-arch ARCH`: a card given by size alone trains in fp16 unless its
architecture says it has fast bf16, as `config` does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import toml

from tests.clihelp import invoke

STANDIN = Path(__file__).resolve().parent / "standin"


@pytest.fixture()
def images(tmp_path) -> Path:
    from PIL import Image

    d = tmp_path / "imgs"
    d.mkdir()
    for i in range(4):
        Image.new("RGB", (512, 512), (50 * i, 90, 160)).save(d / f"i{i}.png")
        (d / f"i{i}.txt").write_text(f"mystyle, picture {i}", encoding="utf-8")
    return d


@pytest.mark.parametrize("arch,precision", [(None, "fp16"), ("ampere", "bf16"), ("turing", "fp16")])
def test_run_precision_follows_the_given_architecture(arch, precision, images, tmp_path):
    base = tmp_path / "base.safetensors"
    base.write_bytes(b"\0" * 64)
    argv = ["run", "--model", "sd15", "--job", "style", "--gpu", "8", "--data", images, "--out", tmp_path / "run",
            "--sd-scripts", STANDIN, "--steps", "4", "--base", base, "--dry-run", "--json"]
    res = invoke(*argv, *(["--gpu-arch", arch] if arch else []))
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    config = toml.load(plan["attempt_config"])
    flat = {k: v for section in config.values() if isinstance(section, dict) for k, v in section.items()}
    flat.update({k: v for k, v in config.items() if not isinstance(v, dict)})
    assert flat["mixed_precision"] == precision
