"""`kohya-tuner dataset check|prep` through the real command line."""

from __future__ import annotations

import json

from tests.clihelp import invoke as _invoke_cli

from test_dataset_images import good_set, hashes, jpeg, problem_set



def run(*args: str):
    return _invoke_cli(*list(args))


def test_check_table_exits_0_with_warnings(tmp_path):
    root = problem_set(tmp_path / "imgs")
    res = run("dataset", "check", str(root), "--job", "character", "--model", "sdxl", "--trigger", "ohwx")
    assert res.exit_code == 0, res.output
    for text in ("truncated", "EXIF", "no caption", "trigger", "dataset prep"):
        assert text in res.output, text


def test_check_json(tmp_path):
    root = good_set(tmp_path / "ok", n=12)
    res = run("dataset", "check", str(root), "--model", "sd15", "--job", "character", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["counts"]["trainable"] == 12 and data["family"] == "sd15" and data["job"] == "character"
    assert {f["code"] for f in data["findings"]} >= {"images", "count", "captions", "sizes"}


def test_check_exit_2_when_nothing_trainable(tmp_path):
    root = tmp_path / "junk"
    root.mkdir()
    (root / "a.png").write_bytes(b"not a png")
    res = run("dataset", "check", str(root), "--model", "sdxl", "--json")
    assert res.exit_code == 2
    assert json.loads(res.stdout)["findings"][0]["code"] == "no_trainable"


def test_bad_input_is_one_paragraph(tmp_path):
    (tmp_path / "file.jpg").write_bytes(b"x")
    (tmp_path / "empty").mkdir()
    for path, needle in ((tmp_path / "file.jpg", "is a file"), (tmp_path / "empty", "is empty"),
                         (tmp_path / "nope", "does not exist")):
        res = run("dataset", "check", str(path), "--model", "sdxl")
        assert res.exit_code == 2 and needle in res.output and "Traceback" not in res.output
    res = run("dataset", "check", str(tmp_path), "--model", "sd9")
    assert res.exit_code == 2 and "Unknown model family" in res.output


def test_prep_default_out_json_and_rerun(tmp_path):
    src = good_set(tmp_path / "my photos", n=3)
    jpeg(src / "big.jpg", size=(3000, 2000))
    before = hashes(src)
    res = run("dataset", "prep", str(src), "--model", "sd15", "--trigger", "ohwx", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    out = tmp_path / "my photos.prepared"
    assert data["out"] == str(out) and data["counts"]["written"] >= 1
    assert (out / "big.txt").read_text() == "ohwx\n"
    res = run("dataset", "prep", str(src), "--model", "sd15", "--trigger", "ohwx")
    assert res.exit_code == 0 and "4 already done" in res.output
    assert hashes(src) == before


def test_prep_refuses_to_write_into_the_source(tmp_path):
    src = good_set(tmp_path / "src", n=2)
    res = run("dataset", "prep", str(src), "--out", str(src / "sub"), "--model", "sdxl")
    assert res.exit_code == 2 and "inside the source folder" in res.output
    res = run("dataset", "prep", str(src))
    assert res.exit_code == 2 and "--max-side" in res.output
