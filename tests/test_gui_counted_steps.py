"""What the kohya_ss GUI passes for a file's values where it computes or rewrites them: the steps it
counts in the image folders when max_train_steps is 0 (tests/data/kohya_gui/steps_records.json, the
GUI's own code on real folder layouts, recorded by tools/gui_steps_oracle.py), the words of
additional_parameters as it quotes them, and strings as its TOML writer (toml 0.10.2) writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kohya_tuner import config_io

DATA = Path(__file__).parent / "data" / "kohya_gui"
CASES = {c["name"]: c for c in json.loads((DATA / "steps_cases.json").read_text(encoding="utf-8"))}
RECORDS = json.loads((DATA / "steps_records.json").read_text(encoding="utf-8"))["records"]


def _build(root: Path, case: dict) -> Path:
    for rel, kind in sorted(case["layout"].items()):
        path = root / rel
        if kind == "dir":
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"")
    fields = json.loads(json.dumps(case["fields"]).replace("@ROOT@", str(root)))
    path = root / "gui.json"
    path.write_text(json.dumps(fields), encoding="utf-8")
    return path


def test_the_records_cover_every_tab_and_both_outcomes():
    assert {CASES[r["name"]]["tab"] for r in RECORDS} == {"lora", "dreambooth", "finetune"}
    assert any(r["max_train_steps"] is None for r in RECORDS) and len({r["max_train_steps"] for r in RECORDS}) > 8


@pytest.mark.parametrize("rec", RECORDS, ids=[r["name"] for r in RECORDS])
def test_the_steps_are_what_the_gui_counts(rec, tmp_path):
    assert not rec["refused"]
    loaded = config_io.read_config(_build(tmp_path, CASES[rec["name"]]))
    assert loaded.config.get("max_train_steps") == rec["max_train_steps"]
    if CASES[rec["name"]]["fields"]["max_train_steps"] in (0, "") and "dataset_config" not in CASES[rec["name"]]["fields"]:
        assert any("the GUI counts" in n for n in loaded.notes)


@pytest.mark.parametrize("tab", ["lora", "dreambooth", "finetune"])
def test_a_folder_that_is_not_here_is_said_not_guessed(tab, tmp_path):
    case = next(c for c in CASES.values() if c["tab"] == tab and c["fields"]["max_train_steps"] == 0)
    path = _build(tmp_path, {**case, "layout": {}})
    loaded = config_io.read_config(path)
    assert loaded.config.get("max_train_steps") is None
    assert any("cannot be listed here" in n for n in loaded.notes)


LORA = {"LoRA_type": "Standard", "network_dim": 8, "network_alpha": 8, "optimizer": "AdamW", "learning_rate": 1e-4,
        "max_train_steps": 100}


def _lora(tmp_path: Path, **fields) -> Path:
    (tmp_path / "model.safetensors").write_bytes(b"0")
    data = {**LORA, "pretrained_model_name_or_path": str(tmp_path / "model.safetensors"),
            "output_dir": str(tmp_path / "out"), "train_data_dir": str(tmp_path / "img"), **fields}
    path = tmp_path / "gui.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize("words, key, value", [
    # shlex.quote wraps a word with any character outside [A-Za-z0-9@%+=:,./_-]; with no shell the
    # quotes reach sd-scripts as part of the value.
    ("--output_name my(lora)", "output_name", "'my(lora)'"),
    ("--output_name plain_name", "output_name", "plain_name"),
    ("--vae C:\\models\\vae.safetensors", "vae", "'C:\\models\\vae.safetensors'"),
    ("--vae ~/vae.safetensors", "vae", "'~/vae.safetensors'"),
    ("--output_name \"a b\"", "output_name", "a"),  # the GUI drops double quotes, then splits at spaces
    ("--max_grad_norm 0.5", "max_grad_norm", 0.5),
])
def test_additional_parameters_reach_sd_scripts_as_the_gui_quotes_them(words, key, value, tmp_path):
    loaded = config_io.read_config(_lora(tmp_path, additional_parameters=words))
    assert loaded.config.get(key) == value


@pytest.mark.parametrize("text, read", [
    ("my\u00a0lora", "myxa0lora"),   # a no-break space
    ("a\u00adb", "axadb"),            # a soft hyphen
    ("tab\x1fsep", "tabx1fsep"),
    ("café", "café"),
    ("日本語", "日本語"),
    ("back\\slash", "back\\slash"),
])
def test_strings_are_what_sd_scripts_reads_from_the_gui_toml(text, read, tmp_path):
    loaded = config_io.read_config(_lora(tmp_path, output_name=text))
    assert loaded.config.get("output_name") == read
    assert any("TOML writer" in n for n in loaded.notes) == (text != read)


@pytest.mark.parametrize("path", ["D:\\models\\xl\\sd_xl_base.safetensors", "/data/\\xl/model.safetensors"])
def test_a_backslash_x_the_gui_toml_cannot_carry_is_a_problem(path, tmp_path):
    from kohya_tuner.cli.app import run as cli

    gui = _lora(tmp_path, pretrained_model_name_or_path=path)
    loaded = config_io.read_config(gui)
    assert [p.rule for p in loaded.problems] == ["gui_toml_unreadable"]
    assert cli(["check", str(gui), "--json"]) == 2


@pytest.mark.parametrize("form", ["bom", "latin-1", "utf-8"])
def test_a_file_the_gui_cannot_open_is_read_with_a_note(form, tmp_path):
    path = _lora(tmp_path, output_dir="/out/José")
    text = path.read_text(encoding="utf-8").replace("\\u00e9", "é")  # as the GUI writes it (ensure_ascii off)
    assert "José" in text
    data = {"bom": b"\xef\xbb\xbf" + text.encode("utf-8"), "latin-1": text.encode("latin-1"),
            "utf-8": text.encode("utf-8")}[form]
    path.write_bytes(data)
    loaded = config_io.read_config(path)
    cannot = [n for n in loaded.notes if "GUI cannot open this file" in n]
    assert bool(cannot) == (form != "utf-8")
    if form == "latin-1":
        assert "U+FFFD" in cannot[0]
