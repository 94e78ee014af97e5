"""A kohya_ss GUI file whose numeric fields hold text the GUI's own int()/float() cannot turn into a count
("inf", "nan", "1e400", a word): every such field of the GUI's own presets, in turn, is read or refused with
one clear message, never a traceback (an OverflowError from int(float("inf")) escaped before)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kohya_tuner import config_gui
from kohya_tuner.errors import UserError

INPUTS = Path(__file__).parent / "data" / "kohya_gui" / "inputs"
# Three presets spread over the GUI's own files (different tabs and families).
_ALL = sorted(INPUTS.rglob("*.json"))
FILES = _ALL[:: max(1, len(_ALL) // 3)][:3]
BAD = ["inf", "-inf", "nan", "1e400", "-1e400", "twelve", ""]


def _numeric_keys(data: dict) -> list[str]:
    return [k for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
@pytest.mark.parametrize("bad", BAD)
def test_a_numeric_field_the_gui_cannot_count_is_read_or_refused_clearly(path, bad):
    data = json.loads(path.read_text(encoding="utf-8"))
    # A dataset config and a step count make the GUI's warmup and step arithmetic run.
    data.setdefault("max_train_steps", 1000)
    data.setdefault("lr_warmup_steps", 0)
    data.setdefault("lr_warmup", 0)
    data["dataset_config"] = "/nonexistent/dataset.toml"
    keys = _numeric_keys(data)
    assert keys
    for key in keys:
        text = json.dumps({**data, key: bad})
        try:
            config_gui.read_gui_json(text)
        except UserError as exc:
            assert exc.message.strip()
