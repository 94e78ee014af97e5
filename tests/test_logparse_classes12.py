"""Classes behind batch 21's first-read misses: a sampler's own steps bar is not the training bar; a
bar whose description reports the loss and the learning rate is a training bar; the web UI's
textual-inversion training says its learning-rate stages, and its tab checks its options before it
trains. Several forms of each, and text that must not be read as them."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from tests.logparse_texts import HEAD, OOM, frame, phase

_SAMPLE = "generating sample images at step / サンプル画像生成 ステップ: 280\n"


# ---- a sampler's own steps are not the training bar -------------------------------------------------------

@pytest.mark.parametrize("desc", ["Denoising steps", "Inference steps", "Sampling steps", "Diffusion steps",
                                  "Generation steps"])
def test_a_samplers_steps_bar_is_not_the_training_bar(desc):
    d = diagnose(parse_text(_SAMPLE + f"{desc}: 100%|██████████| 20/20 [00:10<00:00,  2.00it/s]\n" + OOM))
    assert (d.phase, d.step) == ("sampling", 280)


@pytest.mark.parametrize("desc", ["steps", "Epoch 1/9 - steps", "training steps"])
def test_the_training_steps_bar_is_still_the_training_bar(desc):
    d = diagnose(parse_text(_SAMPLE + f"{desc}:  50%|█████     | 300/600 [10:00<10:00,  1.00it/s]\n" + OOM))
    assert (d.phase, d.step) == ("training", 300)


# ---- a bar whose description reports the loss and the learning rate -------------------------------------

@pytest.mark.parametrize("desc", [
    "Loss EMA * 1000: 30.6680, Loss Velosity: -0.1441, Current LR: 1.99e-04, Epoch: 1",
    "loss 0.123, lr 1e-4",
    "Epoch 2, loss: 0.5, learning rate: 0.0001",
])
def test_a_bar_reporting_loss_and_learning_rate_in_its_description_is_the_training_bar(desc):
    text = (f"{desc}:   7%|▋         | 2/30 [00:05<01:19,  2.83s/it]\n" + HEAD
            + frame("/t/train.py", 617, "train_diff2", "t.a.backward(loss)") + OOM)
    d = diagnose(parse_text(text))
    assert (d.phase, d.step, d.total_steps) == ("training", 2, 30)


@pytest.mark.parametrize("desc", ["Computing loss weights", "Loading LoRA weights", "already cached, loss-free"])
def test_descriptions_without_both_are_no_training_bar(desc):
    d = diagnose(parse_text(f"{desc}:   7%|▋         | 2/30 [00:05<01:19,  2.83s/it]\n" + OOM))
    assert d.step is None


# ---- the web UI's textual-inversion training -------------------------------------------------------------

def test_a_learning_rate_stage_is_training():
    assert phase("Training at rate of 0.005 until step 100\n" + OOM) in ("first_step", "training")


@pytest.mark.parametrize("fn, path", [("train_embedding", "textual_inversion"), ("train_hypernetwork", "hypernetworks")])
def test_the_web_ui_tab_checking_its_options_is_start_up(fn, path):
    text = (HEAD + frame("/w/modules/call_queue.py", 45, "f", "res = list(func(*args, **kwargs))")
            + frame(f"/w/modules/{path}/ui.py", 26, fn, "assert not shared.cmd_opts.lowvram, 'no lowvram'")
            + "AssertionError: Training models with lowvram not possible\n")
    assert phase(text) == "model_load"


def test_the_web_ui_tabs_training_itself_is_not_start_up():
    text = (HEAD + frame("/w/modules/textual_inversion/ui.py", 30, "train_embedding",
                         "embedding, filename = modules.textual_inversion.textual_inversion.train_embedding(*args)")
            + frame("/w/modules/textual_inversion/textual_inversion.py", 500, "train_embedding",
                    "loss.backward()") + OOM)
    assert phase(text) in ("first_step", "training")
