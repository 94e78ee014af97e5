"""dataset.scan / check: every finding, on image sets built in a temporary folder."""

from __future__ import annotations

import json
import os

import pytest
from PIL import Image

from kohya_tuner import dataset
from kohya_tuner.dataset import guidance
from kohya_tuner.dataset.captions import add_trigger, has_trigger, near_duplicate_groups
from kohya_tuner.errors import UserError
from test_dataset_images import BAD_NAME, caption, good_set, hashes, jpeg, png, problem_set


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    root = problem_set(tmp_path_factory.mktemp("ds") / "my images")
    before = hashes(root)
    report = dataset.check(root, "character", "sdxl", trigger="ohwx", workers=2)
    return root, before, report


def _img(report, name):
    matches = [i for i in report.images if i.path == name]
    assert matches, f"{name} not in report: {[i.path for i in report.images]}"
    return matches[0]


def _finding(report, code):
    found = [f for f in report.findings if f.code == code]
    return found[0] if found else None


def test_every_file_problem_is_found(problems):
    _, _, report = problems
    expect = {
        "corrupt.png": "not_an_image",
        "garbage.jpg": "not_an_image",
        "truncated.jpg": "truncated",
        "cmyk.jpg": "cmyk",
        "grey16.png": "sixteen_bit",
        "anim.png": "animated",
        "alpha.png": "alpha",
        "rotated.jpg": "exif_rotated",
        "nocaption.jpg": "caption_missing",
        "emptycap.jpg": "caption_no_lines",
        "blankcap.jpg": "caption_empty",
        "bomcap.jpg": "caption_bom",
        "cp1252cap.jpg": "caption_encoding",
        "multiline.jpg": "caption_multiline",
        "notrigger.jpg": "trigger_missing",
        "Mixed.Jpg": "extension_case",
        "clip.gif": "convertible",
        "scan.tiff": "convertible",
        "huge.jpg": "huge",
        "tiny.png": "tiny",
        "wide.png": "extreme_aspect",
        "loop.png": "unreadable",
        "broken.jpg": "unreadable",
    }
    for name, code in expect.items():
        assert code in _img(report, name).problems, (name, _img(report, name).problems)
        finding = _finding(report, code)
        assert finding is not None and name in finding.files, code
    # Nothing is flagged that should not be.
    assert _img(report, "opaque_rgba.png").problems == []
    assert _img(report, "img03.jpg").problems == []
    assert "loop" in _img(report, "loop.png").error


def test_severities_and_trainability(problems):
    _, _, report = problems
    sev = {f.code: f.severity for f in report.findings}
    for code in ("not_an_image", "truncated", "caption_no_lines", "caption_encoding", "unreadable"):
        assert sev[code] == "fail", code
    for code in ("cmyk", "alpha", "exif_rotated", "huge", "tiny", "extreme_aspect", "caption_missing",
                 "trigger_missing", "other_files", "orphan_captions", "nested_ignored", "duplicate_images",
                 "convertible", "extension_case"):
        assert sev[code] == "warn", code
    assert not _img(report, "truncated.jpg").trainable
    assert not _img(report, "clip.gif").trainable  # sd-scripts does not glob .gif
    assert not _img(report, "Mixed.Jpg").trainable  # nor .Jpg on Linux
    assert _img(report, "rotated.jpg").trainable  # loads, but trains sideways
    assert report.status == "fail"
    assert report.trainable


def test_exif_orientation_gives_the_displayed_size(problems):
    _, _, report = problems
    rotated = _img(report, "rotated.jpg")
    assert (rotated.width, rotated.height, rotated.orientation) == (400, 600, 6)


def test_folder_level_findings(problems):
    _, _, report = problems
    assert _finding(report, "other_files").files == ["notes.md"]  # .DS_Store is not worth a word
    assert _finding(report, "orphan_captions").files == ["orphan.txt"]
    assert "extras/nested.jpg" in _finding(report, "nested_ignored").files
    assert "extras/up" in _finding(report, "linked_folder").files  # a folder link (here a loop) is never entered
    assert sorted(_finding(report, "duplicate_images").files) == ["copy of img00.jpg", "img00.jpg"]
    count = _finding(report, "count")
    distinct = report.counts()["unique_trainable"]
    assert count.severity == "pass" and str(distinct) in count.message


def test_unicode_and_undecodable_names_survive_json(problems):
    _, _, report = problems
    assert _img(report, "fóto ünicode 1.jpg").caption.startswith("ohwx")
    shown = BAD_NAME.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    assert _img(report, shown).trainable
    text = json.dumps(report.to_json(), ensure_ascii=False)
    text.encode("utf-8")  # no lone surrogates: printable and writable as UTF-8


def test_check_never_changes_the_source(problems):
    root, before, _ = problems
    assert hashes(root) == before


def test_count_against_job_guidance(tmp_path):
    root = good_set(tmp_path / "few", n=6)
    rep = dataset.check(root, "character", "sd15")
    assert _finding(rep, "count").severity == "warn"
    rep = dataset.check(root, "style", "sd15")
    assert _finding(rep, "count").severity == "warn" and "50-200" in _finding(rep, "count").message
    more = good_set(tmp_path / "fifteen", n=15)
    assert _finding(dataset.check(more, "character", "sd15"), "count").severity == "pass"
    assert _finding(dataset.check(more, "concept", "sd15"), "count").severity == "pass"
    assert _finding(dataset.check(more, "style", "sd15"), "count").severity == "warn"


@pytest.mark.parametrize("n,job,severity", [
    (3, "character", "warn"), (9, "character", "warn"), (10, "character", "pass"), (20, "character", "pass"),
    (50, "character", "pass"), (51, "character", "warn"), (19, "style", "warn"), (49, "style", "warn"),
    (50, "style", "pass"), (200, "style", "pass"), (301, "style", "warn"), (4, None, "warn"), (12, None, "pass"),
])
def test_count_verdict_bands(n, job, severity):
    assert guidance.count_verdict(n, job)[0] == severity


def test_all_captions_ok_and_trigger_pass(tmp_path):
    root = good_set(tmp_path / "ok", n=12)
    rep = dataset.check(root, "character", "sd15", trigger="OHWX")  # matching ignores case
    codes = {f.code: f.severity for f in rep.findings}
    assert codes["captions"] == "pass" and codes["trigger"] == "pass" and codes["images"] == "pass"
    assert "trigger_missing" not in codes and rep.status in ("pass", "warn")


def test_near_duplicate_captions(tmp_path):
    root = tmp_path / "same"
    root.mkdir()
    for i in range(8):
        jpeg(root / f"{i}.jpg", colour=(i * 30, 0, 0))
        caption(root / f"{i}.txt", "ohwx woman, portrait" if i < 6 else f"ohwx woman on a boat at sea number {i}")
    rep = dataset.check(root, "character", "sd15", trigger="ohwx")
    f = _finding(rep, "near_duplicate_captions")
    assert f is not None and len(f.files) == 6


def test_near_duplicate_groups_unit():
    caps = {"a": "ohwx, red dress, park", "b": "ohwx, park, red dress", "c": "ohwx, blue car on a bridge at night",
            "d": "OHWX red dress park!", "e": ""}
    groups = near_duplicate_groups(caps, trigger="ohwx")
    assert groups == [["a", "b", "d"]]
    assert near_duplicate_groups({"x": "one two three four", "y": "one two three five"}, threshold=0.6) == \
        [["x", "y"]]
    assert near_duplicate_groups({"x": "one two three four", "y": "one two three five"}) == []


def test_trigger_matching():
    assert has_trigger("a photo of ohwx, smiling", "ohwx")
    assert not has_trigger("a photo of ohwxyz", "ohwx")
    assert has_trigger("sks_dog running", "sks_dog")
    assert add_trigger("a woman", "ohwx") == "ohwx, a woman"
    assert add_trigger("ohwx woman", "ohwx") == "ohwx woman"
    assert add_trigger(None, "ohwx") == "ohwx"


def test_sizes_against_preset_buckets_and_overrides(tmp_path):
    root = tmp_path / "sizes"
    root.mkdir()
    png(root / "a.png", size=(1024, 1024))
    png(root / "b.png", size=(700, 700))
    rep = dataset.check(root, None, "sdxl")
    assert rep.resolution == 1024 and rep.bucket_no_upscale is not None
    assert _finding(rep, "sizes").severity == "pass"  # 700 px is 1.46x below 1024: under the 1.5x line
    rep = dataset.check(root, None, "sdxl", resolution=1280)
    assert _finding(rep, "tiny").files == ["b.png"]
    assert "own size" in _finding(rep, "tiny").message  # the SDXL preset sets bucket_no_upscale
    rep = dataset.check(root, None, "sdxl", resolution=1280, bucket_no_upscale=False)
    assert "upscales" in _finding(rep, "tiny").message
    rep = dataset.check(root, None, "sd15", resolution=256)
    assert _finding(rep, "huge").files == ["a.png", "b.png"]  # 4x and 2.7x the 256 px training size
    assert "sizes" not in {f.code for f in rep.findings}


def test_buckets_follow_sd_scripts_rules():
    sd = guidance.bucket_list(512, 256, 1024, 64)
    assert (512, 512) in sd and (256, 1024) in sd and (1024, 256) in sd
    assert all(w * h <= 512 * 512 and w % 64 == 0 and h % 64 == 0 for w, h in sd)
    assert guidance.max_bucket_aspect(512, 256, 1024, 64) == 4.0
    assert guidance.max_bucket_aspect(1024, 512, 1536, 32) == 3.0
    assert guidance.bucket_for(1600, 900, guidance.bucket_list(1024, 256, 2048, 32)) == (1344, 768)
    assert guidance.largest_bucket_side(1024, 512, 1536, 32) == 1536


@pytest.mark.parametrize("images,job,steps,batch,expected", [
    (15, "character", 1500, 1, 10),
    (15, "character", 1500, 2, 20),
    (100, "style", 2000, 1, 2),
    (400, "style", 1000, 1, 1),
    (1, "character", 100000, 1, 100),
    (0, "character", 1000, 1, 1),
])
def test_suggest_repeats(images, job, steps, batch, expected):
    assert dataset.suggest_repeats(images, job, steps, batch) == expected


def test_suggest_repeats_makes_the_planned_epochs():
    r = dataset.suggest_repeats(15, "character", 1500, 1)
    assert guidance.steps_per_epoch(15, r, 1) * 10 == 1500


def test_kohya_folder_layout(tmp_path):
    root = tmp_path / "img"
    good_set(root / "10_ohwx woman", n=5)
    good_set(root / "2_style", n=3)
    (root / "5_empty").mkdir()
    (root / "10_ohwx woman" / "deeper").mkdir()
    jpeg(root / "10_ohwx woman" / "deeper" / "x.jpg")
    rep = dataset.scan(root)
    subsets = {s.dir: (s.repeats, s.class_tokens, s.images) for s in rep.subsets}
    assert subsets == {"10_ohwx woman": (10, "ohwx woman", 5), "2_style": (2, "style", 3)}
    assert len(rep.trainable) == 8
    assert _finding(rep, "layout").severity == "pass"
    assert _finding(rep, "nested_ignored").files == ["10_ohwx woman/deeper/x.jpg"]


def test_pictures_beside_numbered_folders_make_a_plain_folder(tmp_path):
    root = good_set(tmp_path / "trip", n=4)
    good_set(root / "2024_summer", n=2)  # a dated folder, not 2024 repeats
    rep = dataset.scan(root)
    assert [(s.dir, s.repeats) for s in rep.subsets] == [("", None)]
    assert len(rep.trainable) == 4
    assert len(_finding(rep, "nested_ignored").files) == 2


def test_caption_extension_is_guessed_and_mixed_warned(tmp_path):
    root = tmp_path / "capext"
    root.mkdir()
    for i in range(3):
        jpeg(root / f"{i}.jpg")
        caption(root / f"{i}.caption", f"ohwx thing {i} on a table")
    caption(root / "0.txt", "stray txt caption")
    rep = dataset.scan(root)
    assert rep.caption_extension == ".caption"
    assert _finding(rep, "caption_extension_mixed").files == ["0.txt"]
    assert dataset.scan(root, caption_extension=".txt").caption_extension == ".txt"


def test_nothing_trainable(tmp_path):
    root = tmp_path / "broken"
    root.mkdir()
    (root / "a.jpg").write_bytes(b"nope")
    (root / "b.txt").write_text("caption")
    rep = dataset.check(root, "character", "sdxl")
    assert not rep.trainable
    assert rep.findings[0].code == "no_trainable" and rep.findings[0].severity == "fail"


@pytest.mark.parametrize("make,needle", [
    (lambda p: p.write_text("x") and p, "is a file"),
    (lambda p: p, "does not exist"),
    (lambda p: p.mkdir() or p, "is empty"),
    (lambda p: os.symlink(p.name, p) or p, "loops"),
])
def test_bad_paths_are_user_errors(tmp_path, make, needle):
    path = make(tmp_path / "target")
    with pytest.raises(UserError) as exc:
        dataset.check(path, "character", "sdxl")
    assert needle in exc.value.paragraph()


def test_bad_job_and_model_fail_fast(tmp_path):
    root = good_set(tmp_path / "ok", n=2)
    with pytest.raises(UserError, match="Unknown job"):
        dataset.check(root, "portraits", "sdxl")
    with pytest.raises(UserError, match="Unknown model family"):
        dataset.check(root, "character", "sd4")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file(tmp_path):
    root = good_set(tmp_path / "perm", n=2)
    (root / "img00.jpg").chmod(0)
    try:
        rep = dataset.scan(root)
        assert "unreadable" in _img(rep, "img00.jpg").problems
    finally:
        (root / "img00.jpg").chmod(0o644)


def test_parallel_and_serial_scans_agree(tmp_path):
    root = good_set(tmp_path / "many", n=20)
    a = dataset.scan(root, workers=1)
    b = dataset.scan(root, workers=2)
    assert a.model_dump() == b.model_dump()


def test_progress_is_reported(tmp_path):
    root = good_set(tmp_path / "p", n=5)
    seen = []
    dataset.scan(root, progress=lambda done, total, name: seen.append((done, total)))
    assert seen[-1] == (5, 5) and len(seen) == 5


def test_too_many_pixels_is_reported_without_decoding(tmp_path, monkeypatch):
    root = tmp_path / "bomb"
    root.mkdir()
    png(root / "big.png", size=(300, 300))
    png(root / "ok.png", size=(100, 100))
    # Shrink Pillow's limit so a small file plays the 180-megapixel photo.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 20000)
    rep = dataset.scan(root, workers=1)
    big = _img(rep, "big.png")
    assert "too_many_pixels" in big.problems and (big.width, big.height) == (300, 300)
    assert Image.MAX_IMAGE_PIXELS == 20000  # restored after the header-only look


def _square(x: int) -> int:
    if x == 13:
        raise ValueError("unlucky")
    return x * x


def test_parallel_map_keeps_order_and_raises():
    from kohya_tuner.dataset.parallel import parallel_map

    done = []
    assert parallel_map(_square, list(range(12)) + [14] * 10, workers=2,
                        on_result=lambda i, r: done.append(i)) == [x * x for x in list(range(12)) + [14] * 10]
    assert sorted(done) == list(range(22))
    with pytest.raises(ValueError, match="unlucky"):
        parallel_map(_square, list(range(30)), workers=2)


def test_parallel_scan_with_a_thread_running(tmp_path):
    """With another thread alive the pool must not fork (forkserver instead) and still work."""
    import threading

    from kohya_tuner.dataset import parallel

    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    try:
        assert parallel._context().get_start_method() != "fork"
        root = good_set(tmp_path / "threads", n=20)
        rep = dataset.scan(root, workers=2)
        assert len(rep.trainable) == 20
    finally:
        stop.set()
        t.join()


def test_layout_and_count_without_decoding(tmp_path):
    root = tmp_path / "img"
    good_set(root / "10_ohwx woman", n=4)
    (root / "10_ohwx woman" / "broken.jpg").write_bytes(b"x")  # counted: names only, as sd-scripts globs
    jpeg(root / "10_ohwx woman" / "odd.Jpg")  # not counted: sd-scripts does not match it on Linux
    good_set(root / "3_extra", n=2)
    subs = dataset.layout(root)
    assert [(s.dir, s.repeats, s.class_tokens, s.images) for s in subs] == [
        ("10_ohwx woman", 10, "ohwx woman", 5), ("3_extra", 3, "extra", 2)]
    assert dataset.count_images(root) == 7
    plain = good_set(tmp_path / "plain", n=3)
    assert [(s.dir, s.repeats, s.images) for s in dataset.layout(plain)] == [("", None, 3)]


def test_permission_denied_is_reported_per_file(tmp_path, monkeypatch):
    """Root ignores file modes, so the refusal is simulated where the file is opened."""
    import errno

    from kohya_tuner.dataset import images

    root = good_set(tmp_path / "perm2", n=3)
    real = images.sha256_file

    def guarded(path):
        if path.endswith("img01.jpg"):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(images, "sha256_file", guarded)
    rep = dataset.scan(root, workers=1)
    bad = _img(rep, "img01.jpg")
    assert bad.problems == ["unreadable"] and bad.error == "permission denied" and not bad.trainable
    assert _finding(rep, "unreadable").severity == "fail" and len(rep.trainable) == 2
