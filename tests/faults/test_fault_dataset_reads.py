"""`dataset check` lists exactly the files `dataset prep` and sd-scripts read, links
included: file links are followed, folder links are not, dot-names are skipped.

sd-scripts' side is its own glob_images() run by the real trainer's Python when the
real-trainer environment variables are set, otherwise its rule as documented in
docs/dataset.md (each IMAGE_EXTENSIONS suffix globbed in each subset's image_dir)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from kohya_tuner import presets
from kohya_tuner.dataset import check, prepare
from kohya_tuner.dataset.images import TRAINER_EXTENSIONS


def _png(path: Path, shade: int) -> None:
    Image.new("RGB", (512, 512), (shade, 20, 20)).save(path)


@pytest.fixture()
def linked_dataset(tmp_path):
    """A plain folder and a kohya_ss layout, each with every kind of link."""
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "inside").mkdir(parents=True)
    _png(elsewhere / "target.png", 1)
    _png(elsewhere / "inside" / "deep.png", 2)
    plain = tmp_path / "plain"
    plain.mkdir()
    _png(plain / "real.png", 3)
    _png(plain / ".hidden.png", 4)
    (plain / "file_link.png").symlink_to(elsewhere / "target.png")
    (plain / "broken_link.png").symlink_to(tmp_path / "nothing.png")
    (plain / "folder_link").symlink_to(elsewhere / "inside")
    (plain / "named_like.png").mkdir()
    (plain / "real.txt").write_text("ohwx\n")
    layout = tmp_path / "layout"
    (layout / "10_ohwx").mkdir(parents=True)
    _png(layout / "10_ohwx" / "a.png", 5)
    (layout / "10_ohwx" / "b.png").symlink_to(elsewhere / "target.png")
    (layout / "5_linked").symlink_to(elsewhere)
    return {"plain": plain, "layout": layout}


def _sd_scripts_reads(image_dirs: list[str]) -> set[str]:
    sd, py = os.environ.get("KOHYA_TUNER_REAL_SDSCRIPTS"), os.environ.get("KOHYA_TUNER_REAL_PYTHON")
    if sd and py and Path(py).exists():
        code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from library.train_util import glob_images; "
                "print(json.dumps([p for d in sys.argv[2:] for p in glob_images(d, '*')]))")
        out = subprocess.run([py, "-c", code, sd, *image_dirs], capture_output=True, text=True, timeout=300,
                             cwd=sd).stdout.strip().splitlines()[-1]
        return set(json.loads(out))
    found = set()
    for d in image_dirs:
        for ext in TRAINER_EXTENSIONS:
            for suffix in (ext, ext.upper()):
                found.update(glob.glob(os.path.join(glob.escape(d), "*" + suffix)))
    return found


@pytest.mark.parametrize("which", ["plain", "layout"])
def test_check_lists_exactly_what_prep_and_sd_scripts_read(which, linked_dataset, tmp_path):
    root = linked_dataset[which]
    plan = presets.compose("sd15", "character", 8)
    dataset = presets.build_dataset(plan, root)  # the image_dirs kohya-tuner gives sd-scripts
    image_dirs = [s["image_dir"] for d in dataset["datasets"] for s in d["subsets"]]
    sd_reads = {os.path.relpath(p, root).replace(os.sep, "/") for p in _sd_scripts_reads(image_dirs)}

    report = check(root, job=None, family="sd15", workers=1)
    check_lists = {i.path for i in report.images if i.seen_by_trainer}
    prep = prepare(root, tmp_path / f"{which}.prepared", family="sd15", workers=1)
    prep_reads = {i.source for i in prep.items}

    assert check_lists == sd_reads == prep_reads
    if which == "plain":
        assert sd_reads == {"real.png", "file_link.png", "broken_link.png", "named_like.png"}
        codes = {f.code: f.files for f in report.findings}
        assert codes["linked_folder"] == ["folder_link"] and codes["hidden_ignored"] == [".hidden.png"]
        # sd-scripts would stop on these two; check says so before training does.
        assert {i.path for i in report.images if "unreadable" in i.problems} == {"broken_link.png", "named_like.png"}
    else:
        assert sd_reads == {"10_ohwx/a.png", "10_ohwx/b.png"}
        assert {f.code: f.files for f in report.findings}["linked_folder"] == ["5_linked"]
        assert [s.dir for s in report.subsets] == ["10_ohwx"]
