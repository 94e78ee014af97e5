"""dataset.prepare: every guarantee of the prepared copy, and find_prepared."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from kohya_tuner import dataset
from kohya_tuner.dataset.walk import MANIFEST_NAME, TMP_SUFFIX
from kohya_tuner.errors import UserError
from test_dataset_images import caption, good_set, hashes, jpeg, png, problem_set

HERE = Path(__file__).resolve().parent


def _manifest(out: Path) -> dict:
    return json.loads((out / MANIFEST_NAME).read_text())


def _temp_files(root: Path) -> list[str]:
    return [f for _d, _s, files in os.walk(root) for f in files if f.endswith(TMP_SUFFIX)]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    base = tmp_path_factory.mktemp("prep")
    src = problem_set(base / "my images")
    before = hashes(src)
    out = base / "my images.prepared"
    result = dataset.prepare(src, out, "sdxl", trigger="ohwx", workers=2)
    return src, out, before, result


def _item(result, source):
    found = [i for i in result.items if i.source == source]
    assert found, source
    return found[0]


def test_originals_are_untouched(prepared):
    src, _out, before, _ = prepared
    assert hashes(src) == before


def test_images_are_fixed(prepared):
    _src, out, _b, result = prepared
    max_side = result.max_side
    assert max_side == dataset.default_max_side("sdxl")
    entries = _manifest(out)["entries"]
    assert len(entries) == sum(1 for i in result.items if i.outcome != "failed")
    for item in entries.values():
        with Image.open(out / item["output"]) as im:
            im.load()
            assert max(im.size) <= max_side, item
            assert im.mode in ("RGB", "L"), item
            assert getattr(im, "n_frames", 1) == 1, item
            assert im.getexif().get(0x0112, 1) == 1, item

    with Image.open(out / "huge.jpg") as im:
        assert max(im.size) == max_side and im.size[0] / im.size[1] == pytest.approx(4 / 3, rel=0.01)
    with Image.open(out / "rotated.jpg") as im:
        # Stored 600x400 with orientation 6 (turn 90° clockwise): upright it is 400x600,
        # and the stored left half (blue) is now the top.
        assert im.size == (400, 600)
        r, g, b = im.getpixel((200, 100))
        assert b > 150 and r < 100
        r, g, b = im.getpixel((200, 500))
        assert r > 150 and b < 100
    with Image.open(out / "grey16.png") as im:
        assert im.mode == "L" and im.getextrema() == (127, 127)  # 32768/65535, not clipped to white
    with Image.open(out / "alpha.png") as im:
        assert im.mode == "RGB" and im.getpixel((10, 10)) == (255, 255, 255) and im.getpixel((300, 10)) == (255, 0, 0)
    with Image.open(out / "cmyk.jpg") as im:
        assert im.mode == "RGB"
    assert "first frame of an animation" in _item(result, "anim.png").actions
    assert _item(result, "img03.jpg").outcome == "copied"
    assert (out / "img03.jpg").read_bytes() == (_src / "img03.jpg").read_bytes()
    # formats sd-scripts does not read are converted; a mixed-case extension is normalised
    assert _item(result, "clip.gif").output == "clip.png"
    assert _item(result, "scan.tiff").output == "scan.png"
    assert _item(result, "Mixed.Jpg").output == "Mixed.jpg"


def test_unreadable_pictures_are_left_out(prepared):
    _src, out, _b, result = prepared
    for name in ("corrupt.png", "garbage.jpg", "truncated.jpg", "loop.png", "broken.jpg"):
        assert _item(result, name).outcome == "failed", name
        assert not (out / name).exists()
    manifest = _manifest(out)
    assert set(manifest["failed"]) >= {"corrupt.png", "truncated.jpg"}


def test_captions(prepared):
    _src, out, _b, result = prepared
    read = lambda name: (out / name).read_text(encoding="utf-8")  # noqa: E731
    assert read("img01.txt").startswith("ohwx woman, photo number 1")
    assert read("notrigger.txt") == "ohwx, a woman reading a book in a library with tall shelves\n"
    assert read("nocaption.txt") == "ohwx\n"  # uncaptioned image: the trigger is its caption
    assert read("bomcap.txt").startswith("ohwx woman") and not read("bomcap.txt").startswith("\ufeff")
    assert read("cp1252cap.txt") == "ohwx woman, café terrace in the old town\n"
    assert read("multiline.txt") == "ohwx woman standing in a field of sunflowers at noon\n"
    assert read("emptycap.txt") == "ohwx\n"
    assert not (out / "orphan.txt").exists()
    assert result.trigger_added >= 4
    # what sd-scripts will see in the copy: nothing left to complain about
    rep = dataset.check(out, "character", "sdxl", trigger="ohwx")
    bad = {f.code for f in rep.findings if f.severity != "pass"}
    assert not bad & {"not_an_image", "truncated", "cmyk", "sixteen_bit", "animated", "alpha", "exif_rotated", "huge",
                      "caption_missing", "caption_empty", "caption_bom", "caption_encoding", "caption_no_lines",
                      "caption_multiline", "trigger_missing", "convertible", "extension_case"}, bad


def test_manifest_maps_outputs_to_sources(prepared):
    src, out, _b, result = prepared
    manifest = _manifest(out)
    assert manifest["source"] == str(src.resolve()) and manifest["complete"] is True
    done = [i for i in result.items if i.outcome != "failed"]
    assert len(manifest["entries"]) == len(done)
    for rel, entry in manifest["entries"].items():
        assert entry["source"] == rel
        assert entry["source_sha256"] == hashlib.sha256((src / rel).read_bytes()).hexdigest()
        assert entry["output_size"] == (out / entry["output"]).stat().st_size
        assert entry["output_sha256"] == hashlib.sha256((out / entry["output"]).read_bytes()).hexdigest()
    assert not _temp_files(out)


def test_second_run_skips_everything(prepared):
    src, out, _b, first = prepared
    mtimes = {p: p.stat().st_mtime_ns for p in out.iterdir() if p.name != MANIFEST_NAME}
    again = dataset.prepare(src, out, "sdxl", trigger="ohwx", workers=2)
    assert again.count("written") == again.count("copied") == 0
    assert again.count("skipped") == first.count("written") + first.count("copied")
    assert again.captions_written == 0
    assert {p: p.stat().st_mtime_ns for p in out.iterdir() if p.name != MANIFEST_NAME} == mtimes


def test_changes_are_picked_up_and_edits_kept(tmp_path):
    src = good_set(tmp_path / "src", n=4)
    out = tmp_path / "out"
    dataset.prepare(src, out, "sd15", trigger="ohwx")
    # change one image, one caption, delete one image, add one; edit a caption in the copy
    jpeg(src / "img00.jpg", size=(2000, 1500), colour=(1, 2, 3))
    caption(src / "img01.txt", "ohwx woman, a new caption")
    (src / "img02.jpg").unlink()
    jpeg(src / "new.jpg")
    (out / "img03.txt").write_text("my own better caption\n")
    res = dataset.prepare(src, out, "sd15", trigger="ohwx")
    outcomes = {i.source: i.outcome for i in res.items}
    assert outcomes == {"img00.jpg": "written", "img01.jpg": "skipped", "img03.jpg": "skipped", "new.jpg": "copied"}
    assert (out / "img01.txt").read_text() == "ohwx woman, a new caption\n"
    assert (out / "img03.txt").read_text() == "my own better caption\n" and res.captions_kept == ["img03.txt"]
    assert not (out / "img02.jpg").exists() and res.removed == ["img02.jpg"]
    with Image.open(out / "img00.jpg") as im:
        assert max(im.size) == dataset.default_max_side("sd15")
    assert set(_manifest(out)["entries"]) == {"img00.jpg", "img01.jpg", "img03.jpg", "new.jpg"}


def test_interrupt_leaves_no_partial_files_and_resumes(tmp_path):
    src = good_set(tmp_path / "src", n=20, size=(1600, 1200))
    before = hashes(src)
    out = tmp_path / "out"
    calls = []

    def stop_after_three(done, total, name):
        calls.append(name)
        if done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        dataset.prepare(src, out, "sd15", workers=2, progress=stop_after_three)
    assert not _temp_files(out)
    manifest = _manifest(out)
    assert manifest["complete"] is False and len(manifest["entries"]) >= 3
    for entry in manifest["entries"].values():  # whatever was recorded is whole
        with Image.open(out / entry["output"]) as im:
            im.load()
    assert dataset.find_prepared(src) is None  # not complete: never used for training
    res = dataset.prepare(src, out, "sd15", workers=2)
    assert res.count("skipped") >= 3 and res.count("failed") == 0
    assert res.count("skipped") + res.count("written") == 20
    assert hashes(src) == before
    assert dataset.find_prepared(src) == out.resolve()


@pytest.mark.skipif(os.name == "nt", reason="SIGINT to a child process is POSIX")
def test_ctrl_c_in_a_real_process(tmp_path):
    src = good_set(tmp_path / "src", n=40, size=(2400, 1800))
    out = tmp_path / "out"
    script = (
        "import sys\n"
        "from kohya_tuner import dataset\n"
        "def p(done, total, name):\n"
        "    print('done', done, flush=True)\n"
        "dataset.prepare(sys.argv[1], sys.argv[2], 'sd15', workers=2, progress=p)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    proc = subprocess.Popen([sys.executable, "-c", script, str(src), str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("done 4"):
            proc.send_signal(signal.SIGINT)
            break
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    assert not _temp_files(out)
    manifest = _manifest(out)
    assert not manifest["complete"]
    for entry in manifest["entries"].values():
        with Image.open(out / entry["output"]) as im:
            im.load()
    res = dataset.prepare(src, out, "sd15", workers=2)
    assert res.count("skipped") >= 4 and res.count("skipped") + res.count("written") == 40


def test_serial_and_parallel_give_the_same_files(tmp_path):
    src = good_set(tmp_path / "src", n=18, size=(1300, 900))
    a = dataset.prepare(src, tmp_path / "a", "sd15", workers=1)
    b = dataset.prepare(src, tmp_path / "b", "sd15", workers=2)
    assert a.workers == 1 and b.workers == 2
    files = lambda d: {k: v for k, v in hashes(d).items() if k != MANIFEST_NAME}  # noqa: E731
    assert files(tmp_path / "a") == files(tmp_path / "b") and len(files(tmp_path / "a")) == 36  # images and captions


def test_same_stem_sources_get_distinct_outputs(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    png(src / "a.png", colour=(1, 1, 1))
    Image.new("RGB", (64, 64), (2, 2, 2)).save(src / "a.gif")
    caption(src / "a.txt", "shared caption")
    res = dataset.prepare(src, tmp_path / "out", max_side=512)
    outputs = sorted(i.output for i in res.items)
    assert len(set(o.lower() for o in outputs)) == 2 and "a.png" in outputs


def test_kohya_layout_is_mirrored(tmp_path):
    src = tmp_path / "img"
    good_set(src / "10_ohwx woman", n=3)
    res = dataset.prepare(src, tmp_path / "img.prepared", "sdxl")
    assert all(i.output.startswith("10_ohwx woman/") for i in res.items)
    assert (tmp_path / "img.prepared" / "10_ohwx woman" / "img00.txt").exists()


@pytest.mark.parametrize("where,needle", [
    (lambda src, tmp: src, "source folder itself"),
    (lambda src, tmp: src / "out", "inside the source folder"),
    (lambda src, tmp: tmp, "contains the source folder"),
])
def test_out_may_not_touch_the_source(tmp_path, where, needle):
    src = good_set(tmp_path / "src", n=2)
    before = hashes(src)
    with pytest.raises(UserError, match=needle):
        dataset.prepare(src, where(src, tmp_path), "sdxl")
    assert hashes(src) == before


def test_out_with_foreign_files_is_refused(tmp_path):
    src = good_set(tmp_path / "src", n=2)
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.me").write_text("user data")
    with pytest.raises(UserError, match="did not write"):
        dataset.prepare(src, other, "sdxl")
    assert (other / "keep.me").read_text() == "user data"
    (tmp_path / "afile").write_text("x")
    with pytest.raises(UserError, match="is a file"):
        dataset.prepare(src, tmp_path / "afile", "sdxl")
    src2 = good_set(tmp_path / "src2", n=2)
    dataset.prepare(src, tmp_path / "copy", "sdxl")
    with pytest.raises(UserError, match="another folder"):
        dataset.prepare(src2, tmp_path / "copy", "sdxl")


def test_prepare_needs_a_size(tmp_path):
    src = good_set(tmp_path / "src", n=1)
    with pytest.raises(UserError, match="--max-side"):
        dataset.prepare(src, tmp_path / "o")
    with pytest.raises(UserError, match="too small"):
        dataset.prepare(src, tmp_path / "o", max_side=10)


def test_find_prepared(tmp_path):
    src = good_set(tmp_path / "photos", n=3)
    assert dataset.find_prepared(src) is None
    sibling = tmp_path / "photos.prepared"
    dataset.prepare(src, sibling, "sd15")
    assert dataset.find_prepared(src) == sibling.resolve()
    caption(src / "img00.txt", "ohwx woman, edited after prep")
    status = dataset.prepared_copy(src)
    assert status is not None and not status.fresh and "caption" in status.stale[0]
    assert dataset.find_prepared(src) is None
    dataset.prepare(src, sibling, "sd15")
    assert dataset.find_prepared(src) == sibling.resolve()
    jpeg(src / "added.jpg")
    assert dataset.find_prepared(src) is None
    assert "new image" in dataset.prepared_copy(src).stale[0]


def test_find_prepared_elsewhere_through_the_registry(tmp_path):
    src = good_set(tmp_path / "photos", n=2)
    custom = tmp_path / "somewhere" / "else"
    dataset.prepare(src, custom, "sdxl")
    assert dataset.find_prepared(src) == custom.resolve()
    assert dataset.find_prepared(tmp_path / "missing") is None


def test_palette_and_greyscale_modes(tmp_path):
    src = tmp_path / "modes"
    src.mkdir()
    Image.new("P", (64, 64), 3).save(src / "pal.png")
    Image.new("L", (64, 64), 90).save(src / "grey.jpg")
    Image.new("1", (64, 64), 1).save(src / "bits.bmp")
    res = dataset.prepare(src, tmp_path / "out", max_side=512)
    acts = {i.source: i.actions for i in res.items}
    assert acts["grey.jpg"] == [] and acts["pal.png"] == ["P to RGB"] and acts["bits.bmp"] == ["1 to RGB"]
    with Image.open(tmp_path / "out" / "pal.png") as im:
        assert im.mode == "RGB"
