"""The start-up convention's training-header clause: a trainer's header announcing its loop, and the
figures printed with it, come before the first step, so a text that stops or fails after it with no
sign that the loop began is start-up; a bar of the loop, an epoch line or a frame of the step after it
make it the first step. Several headers and several signs of the loop."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from tests.logparse_texts import CACHED, HEAD, OOM, frame, phase

_HEADERS = [
    "running training / 学習開始\n  num train images * repeats / 学習画像の数×繰り返し回数: 40\n",
    "***** Running training *****\n  Num examples = 21\n  Num Epochs = 400\n",
    "08/20/2024 23:45:37 - INFO - __main__ - ***** Running training *****\n",
    "Start training LoRA Standard ...\n",
    "Starting training...\n",
    "training...\n",
]


@pytest.mark.parametrize("header", _HEADERS)
def test_a_text_that_stops_or_fails_at_a_training_header_is_start_up(header):
    assert diagnose(parse_text(CACHED + header)).phase == "model_load"
    assert phase(CACHED + header + OOM) == "model_load"
    assert phase(CACHED + header + "Killed\n") == "model_load"


@pytest.mark.parametrize("header", _HEADERS)
@pytest.mark.parametrize("loop", [
    "steps:   0%|          | 0/100 [00:00<?, ?it/s]\n",
    "epoch 1/10\n",
])
def test_a_sign_of_the_loop_after_the_header_is_the_first_step(header, loop):
    assert phase(CACHED + header + loop + OOM) == "first_step"


# (A GUI's "Start training …" is the GUI starting the job, read by its own rule: not a trainer's header.)
@pytest.mark.parametrize("header", [h for h in _HEADERS if not h.startswith("Start training LoRA")])
def test_a_frame_of_the_step_after_the_header_is_the_first_step(header):
    start = "loading model for process 0/1\n"
    step = HEAD + frame("/sd/train_network.py", 900, "train", "accelerator.backward(loss)") + OOM
    assert phase(start + header + step) == "first_step"
    # a generic forward pass under the job's own code counts too: it outranks the header
    forward = (HEAD + frame("/home/u/my_trainer/loop.py", 50, "run", "out = model(batch)")
               + frame("/venv/lib/python3.10/site-packages/torch/nn/modules/module.py", 1553, "_wrapped_call_impl",
                       "return self._call_impl(*args, **kwargs)") + OOM)
    assert phase(start + header + forward) == "first_step"


def test_a_header_after_counted_steps_changes_nothing():
    bar = "steps:  10%|█         | 10/100 [00:10<00:50,  1.00it/s, avr_loss=0.1]\n"
    assert phase(bar + "running training / 学習開始\n" + OOM) == "training"
