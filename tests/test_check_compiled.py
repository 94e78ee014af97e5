"""The parsed copies of kohya_tuner/check/*.toml the checker reads at start-up are current, and a
stale or damaged copy is never used."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from kohya_tuner.check import engine

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import compile_check_data  # noqa: E402


@pytest.mark.parametrize("name", compile_check_data.NAMES)
def test_the_shipped_copy_matches_the_toml(name):
    shipped = (ROOT / "kohya_tuner" / "check" / f"{name}.json").read_text(encoding="utf-8")
    assert shipped == compile_check_data.compiled(name), f"run: python tools/compile_check_data.py ({name})"


@pytest.mark.parametrize("damage", ["{}", "[]", "5", "null", '"x"', "{not json", "",
                                    '{"sha256": "0", "data": {}}', "SHA"])
def test_a_stale_or_damaged_copy_is_ignored(tmp_path, monkeypatch, damage):
    for name in compile_check_data.NAMES:
        (tmp_path / name).write_bytes((engine._HERE / name).read_bytes())
        # "SHA": the right hash over data of the wrong shape.
        text = damage if damage != "SHA" else json.dumps(
            {"sha256": hashlib.sha256((tmp_path / name).read_bytes()).hexdigest(), "data": []})
        (tmp_path / f"{name}.json").write_text(text, encoding="utf-8")
    monkeypatch.setattr(engine, "_HERE", tmp_path)
    for name in compile_check_data.NAMES:
        assert engine._load(name) == engine.parse_toml((tmp_path / name).read_bytes())


def test_the_checker_writes_nothing_at_run_time(tmp_path, monkeypatch):
    monkeypatch.setenv("KOHYA_TUNER_HOME", str(tmp_path))  # where per-user data would go
    engine._rules_doc.cache_clear()
    engine.rules.cache_clear()
    engine.ranges.cache_clear()
    engine.outside_choices.cache_clear()
    res = engine.check({"pretrained_model_name_or_path": "m.safetensors", "network_module": "networks.lora",
                        "resolution": "512", "network_dim": 8}, "train_network.py", complete=True)
    assert res.ok
    assert list(tmp_path.rglob("*")) == []
