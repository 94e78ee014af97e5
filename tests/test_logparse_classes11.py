"""Classes behind batch 20's first-read misses: caching code once the training bar is shown (even at
step 0) is the step encoding its batch; the training bar redrawn but cut before its count means
training went on; PyTorch Lightning's fit loop is the training step unless a validation milestone
says otherwise. Several forms of each, and text that must not be read as them."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from tests.logparse_texts import HEAD, OOM, frame, phase

_ENCODE = (HEAD + frame("/x/dreambooth/__main__.py", 300, "train", "trainer.train()")
           + frame("/x/dreambooth/trainer.py", 383, "train", "model_input = self.vae.encode(pixel_values).latent_dist.sample()")
           + frame("/venv/lib/diffusers/models/autoencoder_kl.py", 260, "encode"))


# ---- the VAE encoding a batch once the training bar is shown -------------------------------------------

@pytest.mark.parametrize("bar, expected", [
    ("Steps:   0%|          | 0/500 [00:00<?, ?it/s]\n", "first_step"),
    ("Steps:  10%|█         | 50/500 [00:50<07:30,  1.00it/s]\n", "training"),
])
def test_the_vae_encoding_once_the_bar_is_shown_is_the_step(bar, expected):
    assert phase(bar + _ENCODE) == expected


def test_the_vae_encoding_with_no_bar_is_latent_caching():
    assert phase(_ENCODE) == "cache_latents"


def test_a_caching_pass_after_a_bar_is_caching_again():
    text = "Steps:   0%|          | 0/500 [00:00<?, ?it/s]\ncaching latents.\n" + _ENCODE
    assert phase(text) == "cache_latents"


# ---- the training bar redrawn, cut before its count ---------------------------------------------------

_SAVED = ("steps:  22%|██▏       | 2250/10000 [32:04<1:50:29,  1.17it/s, avr_loss=0.439]\n"
          "saving checkpoint: /out/model-step00002250.safetensors\n")


@pytest.mark.parametrize("cut", [
    "steps:  25%|███████████████████████████████████▌",
    "steps:  23%|██▎       ",
    "Steps:  25%|██▌",
])
def test_the_training_bar_redrawn_after_a_save_means_training_went_on(cut):
    d = diagnose(parse_text(_SAVED + cut + "\n"))
    assert (d.phase, d.step) == ("training", 2250)


@pytest.mark.parametrize("cut", [
    "caching latents:  25%|██▌",  # another bar
    "steps:  25%|██▌       | 2500/10000 [35:00<1:45:00,  1.17it/s, avr_loss=0.44]",  # not cut: read as such
])
def test_other_cut_bars_are_not_the_training_bar_redrawn(cut):
    d = diagnose(parse_text(_SAVED + cut + "\n"))
    if cut.startswith("caching"):
        assert d.phase != "training"
    else:
        assert d.step == 2500


# ---- PyTorch Lightning's fit loop --------------------------------------------------------------------------

_FIT = (HEAD + frame("main.py", 832, "<module>", "trainer.fit(model, data)")
        + frame("/venv/lib/pytorch_lightning/trainer/trainer.py", 1353, "_run_train", "self.fit_loop.run()")
        + frame("/venv/lib/pytorch_lightning/loops/fit_loop.py", 266, "advance",
                "self._outputs = self.epoch_loop.run(self._data_fetcher)"))


def test_lightnings_fit_loop_is_the_training_step():
    assert phase(_FIT) in ("first_step", "training")


@pytest.mark.parametrize("bar", [
    "Validation DataLoader 0:   0%|          | 0/30 [00:00<?, ?it/s]\n",
    "Sanity Checking DataLoader 0:   0%|          | 0/2 [00:00<?, ?it/s]\n",
])
def test_a_validation_pass_inside_the_fit_loop_is_sampling(bar):
    assert phase(bar + _FIT) == "sampling"


def test_a_steps_own_frames_after_a_sample_are_still_the_next_step():
    # sd-scripts refreshes its bar after sampling; a forward pass's frames after it are the next step.
    text = ("generating sample images at step / サンプル画像生成 ステップ: 50\n" + HEAD
            + frame("/venv/lib/torch/nn/modules/module.py", 1501, "_call_impl", "return forward_call(*args)") + OOM)
    assert phase(text) == "training"


def test_lightnings_run_train_alone_is_not_the_loop():
    text = (HEAD + frame("/venv/lib/pytorch_lightning/trainer/trainer.py", 1345, "_run_train",
                         "self._run_sanity_check()"))
    assert phase(text) == "unknown"
