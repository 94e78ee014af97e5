"""Classes behind batches 44 and 45's first-read misses: the job's arguments printed as argparse's Namespace;
the web UI's generation called from a training function (its preview image); a converted checkpoint being
written. Several forms of each, and text that must not be read so (the latent-diffusion `main.py`'s "Here comes
the checkpoint..." is its exception handler's, printed after any failure, and is left unread)."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from tests.logparse_texts import BAR, CACHING, HEAD, frame, phase


@pytest.mark.parametrize("line", [
    "Namespace(v2=False, max_train_steps=1600, max_train_epochs=20, max_data_loader_n_workers=8, "
    "optimizer_type='Lion', lr_scheduler='cosine', mixed_precision='fp16')",
    "lse, vae=None, max_train_steps=1600, max_train_epochs=20, max_data_loader_n_workers=8, "
    "persistent_data_loader_workers=True, seed=23, gradient_checkpointing=False, dataset_con",
])
def test_the_jobs_arguments_printed_as_a_namespace_are_start_up(line):
    d = diagnose(parse_text(CACHING + line + "\n"))
    assert (d.outcome, d.phase) == ("incomplete", "model_load")


@pytest.mark.parametrize("line", [
    "a=1, b=2, c=3, d=4, e=5",
    "foo_bar=1, baz_qux=2, one_two=3, three_four=4",  # names that are no trainer's arguments
])
def test_other_key_value_lines_are_not(line):
    assert phase(CACHING + line + "\n") == "cache_latents"


@pytest.mark.parametrize("func", ["train_embedding", "train_hypernetwork"])
def test_the_web_uis_generation_from_a_training_function_is_its_preview(func):
    text = (BAR + HEAD + frame("/w/modules/textual_inversion/textual_inversion.py", 395, func,
                               "processed = processing.process_images(p)")
            + frame("/w/modules/processing.py", 533, "process_images_inner", "x = decode_first_stage(model, s)")
            + "RuntimeError: bad\n")
    assert phase(text) == "sampling"


@pytest.mark.parametrize("line", ["Converting to CKPT ...", "Converting to ckpt: /out/model.ckpt"])
def test_a_checkpoint_being_converted_is_the_save(line):
    d = diagnose(parse_text(BAR + line + "\n"))
    assert d.phase == "saving"


def test_the_latent_diffusion_handlers_checkpoint_line_is_left_unread():
    text = ("Sanity Checking DataLoader 0:   0%|          | 0/2 [00:00<?, ?it/s]Here comes the checkpoint...\n"
            + HEAD + frame("main.py", 830, "<module>", "trainer.fit(model, data)") + "RuntimeError: bad\n")
    assert phase(text) != "saving"
