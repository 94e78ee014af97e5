"""Classes behind batches 33 and 34's first-read misses: the step encoding its own batch with the VAE;
OneTrainer's model loaders; mixed precision's gradient scaler stepping the optimizer under the job's
code; a bar whose description is the loss alone; a record tagged with the function that logged it; a
shell script run from a prompt. Several forms of each, and text that must not be read so."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from tests.logparse_texts import CACHING, HEAD, OOM, frame, phase

_VAE = frame("/venv/lib/python3.10/site-packages/diffusers/models/autoencoder_kl.py", 260, "encode", "h = self.encoder(x)")


@pytest.mark.parametrize("source", [
    'latents = vae.encode(batch["images"].to(dtype=vae_dtype)).latent_dist.sample()',
    "latents = vae.encode( batch['pixel_values'].to(weight_dtype)).latent_dist.sample()",
])
def test_the_step_encoding_its_batch_is_the_step(source):
    assert phase(HEAD + frame("/sd/train_network.py", 748, "train", source) + _VAE + OOM) == "first_step"


def test_encoding_images_that_are_no_batch_is_still_caching():
    text = HEAD + frame("/sd/library/train_util.py", 2400, "cache_batch_latents", "latents = vae.encode(img_tensors)")
    assert phase(text + _VAE + OOM) == "cache_latents"


@pytest.mark.parametrize("path", [
    "Q:\\OneTrainer\\modules\\modelLoader\\qwen\\QwenModelLoader.py",
    "/opt/OneTrainer/modules/modelLoader/flux/FluxModelLoader.py",
])
def test_onetrainers_model_loaders_load_the_model(path):
    text = HEAD + frame(path, 144, "load", "self.__load_internal(model)") + "Exception: not an internal model\n"
    assert phase(text) == "model_load"


_SCALER = frame("C:\\webui\\venv\\lib\\site-packages\\torch\\cuda\\amp\\grad_scaler.py", 336, "step",
                "retval = self._maybe_opt_step(optimizer, optimizer_state, *args, **kwargs)")


def test_the_gradient_scalers_step_under_the_jobs_code_is_the_optimizer_step():
    job = frame("C:\\webui\\modules\\textual_inversion\\textual_inversion.py", 335, "train_embedding",
                "scaler.step(optimizer)")
    assert phase(HEAD + job + _SCALER + OOM) in ("first_step", "training")


def test_the_gradient_scaler_alone_says_no_stage():
    assert phase(HEAD + _SCALER + OOM) == "unknown"


@pytest.mark.parametrize("bar,step", [
    ("loss: 0.0903499:   0%|          | 2/54052 [00:02<18:32:09,  1.23s/it]", 2),
    ("[Epoch 12: 5/10]loss: 0.0903:  40%|████      | 120/300 [01:00<01:30,  2.00it/s]", 120),
])
def test_a_bar_described_by_its_loss_is_the_training_bar(bar, step):
    d = diagnose(parse_text(bar + "\n" + OOM))
    assert (d.phase, d.step) == ("training", step)


@pytest.mark.parametrize("bar", ["loss weights:  40%|████      | 4/10 [00:01<00:01,  3.00it/s]",
                                 "computing loss table:  40%|████      | 4/10 [00:01<00:01,  3.00it/s]"])
def test_other_bars_naming_a_loss_are_not(bar):
    assert diagnose(parse_text(bar + "\n" + OOM)).step is None


@pytest.mark.parametrize("line,want", [
    ("[2025-08-02 12:16:18,158] [INFO] [comm.py:706:init_distributed] Initializing TorchBackend in DeepSpeed",
     "model_load"),
    ("[2025-08-02 12:16:18,158] [INFO] [engine.py:100:sample_images] making samples", "sampling"),
])
def test_a_record_tagged_with_its_function(line, want):
    assert phase(CACHING + line + "\n" + OOM) == want


def test_a_tag_whose_function_says_nothing_places_nothing():
    line = "[2025-08-02 12:16:18,158] [INFO] [logging.py:128:log_dist] the moon is full\n"
    assert phase(CACHING + line + OOM) == "cache_latents"


@pytest.mark.parametrize("line", [
    "(diffusers) me@DESKTOP-6IT4DVD:~/github/diffusers/examples/dreambooth$ ./my_training_2.sh",
    "(wan) root@iv-ydxqk42iv:~/DiffSynth-Studio# ./Wan2.1-T2V-14B_train.sh ",
    '[2024-10-04 12:49:56] [INFO] Running bash "/media/u/fluxgym/outputs/x/train.sh"',
    "bash scripts/train_lora.sh",
])
def test_a_shell_script_run_from_a_prompt_starts_the_job(line):
    assert phase(line + "\n" + OOM) == "model_load"


@pytest.mark.parametrize("line", ["see ./train.sh for the options", "wrote /tmp/x/run.sh", "cat install.sh"])
def test_other_lines_naming_a_shell_script_are_not(line):
    assert phase(line + "\n" + OOM) == "unknown"
