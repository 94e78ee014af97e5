"""Inputs a new user brings that used to end in a traceback or a silently wrong result, by class:
links that loop, a dataset_config that is no path, a key sd-scripts ignores, a switch written as a
word, a picture's extension as the caption extension, numbers the GUI cannot read, a UTF-16 file,
bucket bounds that contradict each other."""

from __future__ import annotations

import json

import pytest
import toml
from tests.clihelp import invoke as _invoke

from kohya_tuner.config_gui_form import unreadable_numbers

HEAVY_SDXL = ('mixed_precision = "bf16"\nnetwork_module = "networks.lora"\nnetwork_dim = 64\nnetwork_alpha = 32.0\n'
              'optimizer_type = "AdamW"\nresolution = "1024"\ntrain_batch_size = 4\nsdpa = true\n'
              'output_name = "mine"\n')


def invoke(*args):
    return _invoke(*[str(a) for a in args])


def _clean_refusal(res, *words):
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    for w in words:
        assert w in res.output, (w, res.output)


def test_a_symbolic_link_loop_as_fit_input_or_output(tmp_path):
    (tmp_path / "l1.toml").symlink_to(tmp_path / "l2.toml")
    (tmp_path / "l2.toml").symlink_to(tmp_path / "l1.toml")
    good = tmp_path / "mine.toml"
    good.write_text(HEAVY_SDXL, encoding="utf-8")
    _clean_refusal(invoke("fit", tmp_path / "l1.toml", "-m", "sdxl", "-g", "12", "--out", tmp_path / "o.toml"))
    res = invoke("fit", good, "-m", "sdxl", "-g", "8", "--out", tmp_path / "l1.toml")
    assert res.exit_code in (1, 2) and "Traceback" not in res.output, res.output


@pytest.mark.parametrize("value", [5, 1.5, True, ["a.toml"], {"x": 1}])
@pytest.mark.parametrize("command", ["estimate", "check", "fit"])
def test_a_dataset_config_that_is_no_path(tmp_path, value, command):
    cfg = toml.loads(HEAVY_SDXL)
    if isinstance(value, dict):
        text = HEAVY_SDXL + "[dataset_config]\nx = 1\n"
    else:
        text = toml.dumps({**cfg, "dataset_config": value})
    (tmp_path / "c.toml").write_text(text, encoding="utf-8")
    gui = tmp_path / "g.json"
    gui.write_text(json.dumps({"LoRA_type": "Standard", "sdxl": True, "pretrained_model_name_or_path": "m.safetensors",
                               "network_dim": 8, "dataset_config": value}), encoding="utf-8")
    for src in (tmp_path / "c.toml", gui):
        extra = ["-g", "12", "--out", tmp_path / "fit.toml"] if command == "fit" else (
            ["-g", "12"] if command == "estimate" else [])
        res = invoke(command, src, "-m", "sdxl", *extra)
        assert res.exit_code in (0, 1, 2) and "Traceback" not in res.output, (src.name, res.output)


def test_a_key_sd_scripts_ignores_does_not_stop_the_fit(tmp_path):
    plain, extra = tmp_path / "plain.toml", tmp_path / "extra.toml"
    plain.write_text(HEAVY_SDXL, encoding="utf-8")
    extra.write_text(HEAVY_SDXL + 'foo_bar = 1\n"" = 2\n', encoding="utf-8")
    a = json.loads(invoke("fit", plain, "-m", "sdxl", "-g", "8", "--out", tmp_path / "p8.toml", "--json").stdout)
    b = json.loads(invoke("fit", extra, "-m", "sdxl", "-g", "8", "--out", tmp_path / "e8.toml", "--json").stdout)
    assert a["fits"] and b["fits"], (a, b)
    assert [s["move"] for s in a["steps"]] == [s["move"] for s in b["steps"]]
    # A table nested deeper than sd-scripts flattens cannot be written back: said, not a traceback.
    deep = tmp_path / "deep.toml"
    deep.write_text(HEAVY_SDXL + "[a.b.c]\nd = 1\n", encoding="utf-8")
    res = invoke("fit", deep, "-m", "sdxl", "-g", "8", "--out", tmp_path / "d8.toml")
    assert res.exit_code in (0, 2) and "Traceback" not in res.output, res.output


@pytest.mark.parametrize("word,written", [("False", False), ("false", False), ("no", False), ("off", False),
                                          ("0", False), ('"false"', False), ("True", True), ("YES", True),
                                          ("1", True), ("on", True)])
def test_a_switch_set_as_a_word_is_written_as_a_bool(tmp_path, word, written):
    res = invoke("config", "-m", "sdxl", "-j", "style", "-g", "12", "--set", f"gradient_checkpointing={word}",
                 "--out", tmp_path / "o")
    assert res.exit_code == 0, res.output
    from kohya_tuner import config_io

    cfg = config_io.read_config(tmp_path / "o" / "config.toml").config
    assert cfg["gradient_checkpointing"] is written


@pytest.mark.parametrize("word", ["maybe", "2", "0.5", "[1]"])
def test_a_switch_set_to_anything_else_is_refused(tmp_path, word):
    _clean_refusal(invoke("config", "-m", "sdxl", "-j", "style", "-g", "12", "--set", f"gradient_checkpointing={word}",
                          "--out", tmp_path / "o"), "gradient_checkpointing", "switch")
    assert not (tmp_path / "o").exists()


@pytest.fixture()
def imgs(tmp_path):
    from PIL import Image

    d = tmp_path / "imgs"
    d.mkdir()
    for i in range(3):
        Image.new("RGB", (512, 512), (i * 40, 0, 0)).save(d / f"i{i}.png")
        (d / f"i{i}.txt").write_text("ohwx, a photo", encoding="utf-8")
    return d


@pytest.mark.parametrize("ext", [".png", "PNG", "jpg", ".webp", ".gif", "", ".", "a/b", "*.txt"])
def test_a_caption_extension_that_is_no_caption_is_refused(imgs, tmp_path, ext):
    _clean_refusal(invoke("dataset", "check", imgs, "-m", "sd15", "--caption-ext", ext), "--caption-ext")
    _clean_refusal(invoke("dataset", "prep", imgs, "-m", "sd15", "--out", tmp_path / "p", "--caption-ext", ext),
                   "--caption-ext")
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("ext", [".txt", "txt", ".caption", ".tags"])
def test_caption_extensions_are_taken_with_or_without_the_dot(imgs, ext):
    assert invoke("dataset", "check", imgs, "-m", "sd15", "--caption-ext", ext).exit_code in (0, 1)


@pytest.mark.parametrize("flags,words", [(("--min-bucket", 2048, "--max-bucket", 512), ("Swap",)),
                                         (("--max-bucket", 256), ("--max-bucket 256", "below")),
                                         (("--min-bucket", 1024), ("--min-bucket 1024", "above")),
                                         (("--resolution", 512, "--max-bucket", 384), ("below",))])
def test_bucket_bounds_that_cannot_hold_the_resolution_are_refused(imgs, flags, words):
    _clean_refusal(invoke("dataset", "check", imgs, "-m", "sd15", *flags), *words)


def test_bucket_bounds_around_the_resolution_are_taken(imgs):
    assert invoke("dataset", "check", imgs, "-m", "sd15", "--min-bucket", 256, "--max-bucket", 1024).exit_code in (0, 1)


@pytest.mark.parametrize("key,value,loads", [("learning_rate", "fast", "0.0"), ("unet_lr", "", "0.0"),
                                             ("seed", "2.5", "0"), ("max_token_length", "long", "75"),
                                             ("lr_scheduler_power", [1], "1.0")])
def test_a_gui_number_the_gui_cannot_read_is_named(key, value, loads):
    [line] = unreadable_numbers({key: value, "learning_rate_te": "x"})
    assert key in line and f"loads it as {loads}" in line
    assert unreadable_numbers({key: 1, "seed": "7", "learning_rate": "1e-4", "epoch": 2.0}) == []


def test_the_note_reaches_the_user(tmp_path):
    gui = tmp_path / "g.json"
    gui.write_text(json.dumps({"LoRA_type": "Standard", "sdxl": True, "pretrained_model_name_or_path": "m.safetensors",
                               "network_dim": 8, "learning_rate": "fast"}), encoding="utf-8")
    res = invoke("estimate", gui, "-g", "12")
    assert res.exit_code == 0 and "learning_rate = 'fast'" in res.output, res.output


@pytest.mark.parametrize("encoding,bom", [("utf-16-le", b"\xff\xfe"), ("utf-16-be", b"\xfe\xff"), ("utf-16-le", b"")])
@pytest.mark.parametrize("command", ["estimate", "check", "fit"])
def test_a_utf16_file_is_named_as_such(tmp_path, encoding, bom, command):
    src = tmp_path / "u16.toml"
    src.write_bytes(bom + HEAVY_SDXL.replace("\n", "\r\n").encode(encoding))
    extra = ["-g", "12", "--out", tmp_path / "f.toml"] if command == "fit" else (["-g", "12"] if command == "estimate"
                                                                                 else [])
    _clean_refusal(invoke(command, src, "-m", "sdxl", *extra), "UTF-16", "UTF-8")


@pytest.mark.parametrize("kind", ["fifo", "huge", "folder"])
def test_a_caption_that_cannot_be_read_is_named_by_prep(imgs, tmp_path, kind):
    import os

    cap = imgs / "i1.txt"
    cap.unlink()
    if kind == "fifo":
        os.mkfifo(cap)
    elif kind == "huge":
        cap.write_bytes(b"x" * (5 << 20))
    else:
        cap.mkdir()
    res = invoke("dataset", "prep", imgs, "-m", "sd15", "--out", tmp_path / "p", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert [line.split(":")[0] for line in data["captions_unreadable"]] == ["i1.txt"], data
    assert not (tmp_path / "p" / "i1.txt").exists() and (tmp_path / "p" / "i0.txt").exists()


def test_a_folder_named_like_a_picture_is_called_a_folder(imgs, tmp_path):
    (imgs / "dir.png").mkdir()
    res = invoke("dataset", "prep", imgs, "-m", "sd15", "--out", tmp_path / "p", "--json")
    [item] = [i for i in json.loads(res.stdout)["items"] if i["source"].endswith("dir.png")]
    assert item["reason"] == "a folder, not a file", item


@pytest.mark.parametrize("path", ["/dev/null", "/dev/zero"])
def test_doctor_calls_a_device_no_python_rather_than_missing(path):
    res = invoke("doctor", "--python", path)
    assert res.exit_code == 2 and "not a regular file" in res.output and "does not exist" not in res.output, res.output


def test_prep_says_why_it_leaves_out_a_picture_too_large_to_open(tmp_path):
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    src = tmp_path / "src"
    src.mkdir()
    # A PNG header claiming 60000 x 60000 pixels (3.6 gigapixels) over an empty image stream.
    (src / "b.png").write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 60000, 60000, 8, 2, 0, 0, 0))
                                + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))
    res = invoke("dataset", "prep", src, "-m", "sd15", "--out", tmp_path / "p", "--json")
    [item] = json.loads(res.stdout)["items"]
    assert item["outcome"] == "failed" and "too many pixels" in item["reason"] and "DOS" not in item["reason"], item
