"""Classes behind batches 31 and 32's first-read misses: sd-scripts' `checking cache validity...` belongs
to the caching pass under way; a Rich traceback box a narrow console wrapped (right edges on lines of
their own, a row's text at the start of a line) is still one box; a script saving its pipeline, a
training script's evaluation pass and a model built from its config; the line assigning a training
step's `model_pred`; and (round 24) a traceback header the paste's end cut. Several forms of each, and
text that must not be read so."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from tests.logparse_texts import HEAD, OOM, frame, phase


@pytest.mark.parametrize("caching,want", [
    ("caching Text Encoder outputs with caching strategy.", "cache_text_encoder"),
    ("caching latents with caching strategy.", "cache_latents"),
    ("", "cache_latents"),
])
def test_the_cache_validity_check_is_the_pass_under_way(caching, want):
    bar = " 48%|████▊     | 10/21 [00:01<00:01, 7.00it/s]\n"
    text = (caching + "\n" if caching else "") + "checking cache validity...\n" + bar
    assert phase(text + OOM) == want


def _wrapped_box(rows: list[str]) -> str:
    # Each row's right edge wrapped onto the next line; long source rows wrapped to the line's start.
    out = "─" * 31 + " Traceback (most recent call last)\n" + "─" * 32 + "╮\n"
    for row in rows:
        if row.startswith("\t"):
            out += row[1:] + "\n   │\n"
        else:
            out += "│ " + row + "\n" + " " * 23 + "│\n"
    return out


def test_a_wrapped_rich_box_is_one_box():
    text = _wrapped_box([
        "F:\\kohya_ss\\sdxl_train_network.py:176 in <module>", "", "❱ 176 │   trainer.train(args)",
        "F:\\kohya_ss\\train_network.py:442 in train", "",
        "❱ 442 │   │", "\ttrain_util.resume_from_local_or_hf_if_specified(accelerator, args)",
        "443 │   │",
    ])
    assert phase(text) == "model_load"


def test_a_box_that_is_not_wrapped_ends_at_the_next_line():
    box = ("╭" + "─" * 20 + " Traceback (most recent call last) " + "─" * 20 + "╮\n"
           "│ /x/train_network.py:900 in train" + " " * 40 + "│\n"
           "╰" + "─" * 75 + "╯\n")
    # an unrelated line after the box is not a row of it
    assert phase(box + "steps:  10%|█         | 10/100 [00:10<00:50,  1.00it/s]\n" + OOM) == "training"


@pytest.mark.parametrize("source,want", [
    ("save_pipe(args.output_dir, unet, text_encoder)", "saving"),
    ("self.save_pipeline(path)", "saving"),
    ("eval_pipeline(pipeline, args.eval_path)", "sampling"),
    ("model = build_model(config.model)", "model_load"),
])
def test_what_a_training_scripts_call_names(source, want):
    text = HEAD + frame("/x/finetune/train.py", 900, "main", source) + "ValueError: bad\n"
    assert phase(text) == want


@pytest.mark.parametrize("source", [
    "model_pred = scheduler.get_velocity(model_output, noisy_model_input, timesteps)",
    "model_pred, target = unet(noisy_latents, timesteps, encoder_hidden_states)",
])
def test_the_steps_model_pred_line_is_the_step(source):
    text = HEAD + frame("/x/finetune/train_cogvideox_lora.py", 1368, "main", source) + OOM
    assert phase(text) == "first_step"


@pytest.mark.parametrize("source", ["noise_pred = self.unet(latent_model_input, t)", "if model_pred == target:",
                                    "print(model_pred)"])
def test_other_prediction_lines_are_not(source):
    text = HEAD + frame("/x/pipeline.py", 300, "run", source) + "ValueError: bad\n"
    assert phase(text) not in ("first_step", "training")


@pytest.mark.parametrize("cut", ["Traceback (most rece", "Traceback (most r", "Traceback (most recent call last"])
def test_a_traceback_header_the_paste_cut_is_a_cut_traceback(cut):
    # (round 24) the paste ends inside the header itself
    d = diagnose(parse_text("  return fn(*args, **kwargs)\n" + cut))
    assert (d.outcome, d.error.kind) == ("error", "truncated")


@pytest.mark.parametrize("line", ["Traceback (", "Tracebacks are printed below", "Traceback of the failure:"])
def test_other_lines_starting_with_traceback_are_not(line):
    assert diagnose(parse_text("steps: 0%| | 0/10 [00:00<?, ?it/s]\n" + line + "\n")).outcome == "incomplete"
