"""Classes behind batch 26's remaining first-read misses: a line that gives a step's loss and learning
rate, each with its figure, is training under way; a box whose top edge has no title and that holds no
frame is a panel, its rows read as lines; PyTorch Lightning's device report is its trainer being set
up. Several forms of each, and lines that must not be read as them."""
from __future__ import annotations

import pytest

from tests.logparse_texts import CACHING, HEAD, OOM, frame, phase

_ERR = HEAD + frame("/venv/lib/python3.11/site-packages/click/core.py", 1442, "__call__",
                    "return self.main(*args, **kwargs)") + "ValueError: bad\n"


@pytest.mark.parametrize("line", [
    "Training Step  … ━━━ Loss: 0.0000 LR: 1.00e-05 Time/Step: 0.00s ETA: --:--",
    "{'loss': 0.1234, 'lr': 0.0001, 'epoch': 0.1}",
    "step 12 | loss=0.0812 | learning_rate=1e-4",
    "loss: nan, lr: 2e-05",
])
def test_a_steps_loss_and_learning_rate_are_training(line):
    assert phase(CACHING + line + "\n" + OOM) in ("first_step", "training")
    assert phase(line + "\n" + _ERR) in ("first_step", "training")


@pytest.mark.parametrize("line", [
    "loss_type: l2, learning_rate: 1e-4",
    "learning_rate = 0.0001",
    "loss: l2 (lr scheduler: cosine)",
    "lr_scheduler: cosine, loss weighting: none",
])
def test_settings_that_name_a_loss_or_a_rate_are_not(line):
    assert phase(CACHING + line + "\n" + OOM) not in ("first_step", "training")


def _panel(*rows: str, title: str = "") -> str:
    top = "╭" + ("─" * 20 + f" {title} " + "─" * 20 if title else "─" * 60) + "╮\n"
    return top + "".join(f"│ {r:<58} │\n" for r in rows) + "╰" + "─" * 60 + "╯\n"


def test_an_untitled_panels_rows_are_read_as_lines():
    text = _panel("Training Step  … ━━━ Loss: 0.0000 LR: 1.00e-05") + _ERR
    assert phase(text) == "first_step"
    text = _panel("generating sample images at step 20") + _ERR
    assert phase(text) == "sampling"


def test_an_untitled_panel_of_nothing_says_nothing():
    assert phase(_panel("hello there", "the moon is full") + _ERR) == "unknown"


@pytest.mark.parametrize("line", [
    "GPU available: True (cuda), used: True",
    "TPU available: False, using: 0 TPU cores",
    "HPU available: False, using: 0 HPUs",
    "LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES: [0]",
])
def test_lightnings_device_report_is_start_up(line):
    assert phase(line + "\n" + OOM) == "model_load"
    # a log cut while the job starts: start-up too
    assert phase(line + "\nProject config\nmodel:\n  base_learning_rate: 1.0e-06\n") == "model_load"


@pytest.mark.parametrize("line", ["GPU available memory: 10 GiB", "The GPU available to you: none"])
def test_other_availability_lines_are_not(line):
    assert phase(line + "\n" + OOM) == "unknown"
