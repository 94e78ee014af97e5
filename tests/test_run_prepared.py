"""`run --data DIR` trains from a fresh `dataset prep` copy of DIR, exactly as `config` does."""

from __future__ import annotations

import json
from pathlib import Path

from tests.clihelp import invoke

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "tests" / "standin"


def _images(root: Path) -> Path:
    from PIL import Image

    root.mkdir()
    for i in range(6):
        Image.new("RGB", (512, 512), (40 * i, 120, 200 - 20 * i)).save(root / f"img{i}.png")
        (root / f"img{i}.txt").write_text(f"mystyle, picture {i}", encoding="utf-8")
    (root / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)  # prep leaves it out
    return root


def _run(data: Path, out: Path, base: Path):
    return invoke("run", "--model", "sd15", "--job", "style", "--gpu", "8", "--cpu", "--data", data, "--out", out,
                  "--sd-scripts", STANDIN, "--steps", "4", "--base", base, "--dry-run", "--json")


def test_run_checks_and_trains_from_the_prepared_copy(tmp_path):
    data = _images(tmp_path / "imgs")
    base = tmp_path / "base.safetensors"
    base.write_bytes(b"\0" * 64)
    refused = _run(data, tmp_path / "before", base)
    assert refused.exit_code == 2 and "cannot be trained on" in refused.stderr

    prep = invoke("dataset", "prep", data, "--model", "sd15", "--json")
    assert prep.exit_code == 0, prep.output
    prepared = Path(json.loads(prep.stdout)["out"])

    res = _run(data, tmp_path / "after", base)
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    assert Path(plan["data"]) == prepared
    assert any("prepared copy" in n for n in plan["notes"])
    config = json.loads(invoke("config", "--model", "sd15", "--job", "style", "--gpu", "8", "--data", data,
                               "--out", tmp_path / "cfg", "--json").stdout)
    image_dirs = {Path(s["image_dir"]).parent if Path(s["image_dir"]).parent == prepared else Path(s["image_dir"])
                  for d in config["dataset"]["datasets"] for s in d["subsets"]}
    assert image_dirs == {prepared}
    run_ds = (tmp_path / "after" / "dataset.toml").read_text(encoding="utf-8")
    assert str(prepared) in run_ds
