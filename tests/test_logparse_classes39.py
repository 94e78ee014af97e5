"""Classes behind batches 62 to 69's first-read misses that round 38 left: an exception whose message begins
with "argument" is not argparse's error; the max-norm regularisation after an optimizer step; a notebook
starting its trainer; the web UI's Dreambooth extension setting itself up; a record whose level is padded
inside brackets before a dash (PaddleNLP's logger). Several forms of each, and text that must not be read so."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from kohya_tuner.logparse.patterns import clean_record, error_kind
from tests.logparse_texts import BAR, HEAD, frame, phase


@pytest.mark.parametrize("line", ["TypeError: argument of type 'NoneType' is not iterable",
                                  "TypeError: argument 'metadata': 'int' object cannot be converted to 'PyString'",
                                  "ValueError: argument must be a positive integer"])
def test_an_exception_whose_message_begins_with_argument_is_no_bad_argument(line):
    assert error_kind(line) != "bad_argument"


@pytest.mark.parametrize("line", ["train_network.py: error: argument --network_dim: invalid int value: 'x'",
                                  "usage: x\nerror: argument --lr: expected one argument",
                                  "sdxl_train.py: error: unrecognized arguments: --foo"])
def test_argparse_refusing_an_argument_still_is(line):
    assert error_kind(line.splitlines()[-1]) == "bad_argument"


def test_a_lone_library_frame_and_an_argument_type_error_say_no_stage():
    text = ('  File "/v/lib/site-packages/diffusers/models/unet_2d_condition.py", line 876, in forward\n'
            '    if "text_embeds" not in added_cond_kwargs:\n'
            "TypeError: argument of type 'NoneType' is not iterable\n")
    assert phase(text) == "unknown"


@pytest.mark.parametrize("source", ["keys_scaled, mean_norm, maximum_norm = network.apply_max_norm_regularization(",
                                    "keys_scaled, mean_norm, maximum_norm = accelerator.unwrap_model(network)"
                                    ".apply_max_norm_regularization(args.scale_weight_norms, accelerator.device)"])
def test_the_max_norm_regularisation_after_a_step_is_the_step(source):
    text = (HEAD + frame("F:\\k\\sdxl_train_network.py", 183, "<module>", "trainer.train(args)")
            + frame("F:\\k\\train_network.py", 827, "train", source)
            + frame("F:\\k\\venv\\lib\\site-packages\\lycoris\\kohya\\__init__.py", 615,
                    "apply_max_norm_regularization", "return scaled, sum(norms)/len(norms), max(norms)")
            + "ZeroDivisionError: division by zero\n")
    assert phase(text) in ("first_step", "training")
    assert phase(BAR + text) == "training"


def test_a_function_defined_with_that_name_is_not_a_call():
    text = (HEAD + frame("/w/lycoris/kohya/__init__.py", 600, "apply_max_norm_regularization",
                         "norms.append(norm)") + "RuntimeError: bad\n")
    assert phase(text) == "unknown"


@pytest.mark.parametrize("line", ["⭐ Starting trainer...", "Starting trainer", "Launching the trainer now",
                                  "*** Starting trainer ***"])
def test_a_notebook_starting_its_trainer_is_start_up(line):
    assert phase(line + "\n") == "model_load"


@pytest.mark.parametrize("line", ["Starting trainer loop", "trainer finished", "Starting trainer failed: x"])
def test_other_words_about_a_trainer_are_not(line):
    assert phase(line + "\n") != "model_load"


@pytest.mark.parametrize("lines", [
    ["Initializing Dreambooth", "Dreambooth revision: 71c3465b6c866050b147c58e2caf41984df2cf45"],
    ["Checking xformers...", "Checking Dreambooth requirements...", "[Dreambooth] accelerate v0.21.0 is already "
     "installed."],
])
def test_the_dreambooth_extension_setting_itself_up_is_start_up(lines):
    assert phase("\n".join(lines) + "\n") == "model_load"


@pytest.mark.parametrize("line", ["Dreambooth revision: 71c3465", "Checking xformers...",
                                  "Initializing the web UI"])
def test_its_other_lines_alone_say_no_stage(line):
    assert phase(line + "\n") == "unknown"


@pytest.mark.parametrize("line, level, message", [
    ("[2023-07-19 14:47:55,500] [    INFO] - ***** Running training *****", "INFO", "***** Running training *****"),
    ("2023-07-19 14:47:55,488] [ WARNING] - world_size : 1", "WARNING", "world_size : 1"),
    ("[2023-07-19 14:47:55,488] [CRITICAL] - boom", "CRITICAL", "boom"),
    ("[2023-07-19 14:47:55,488] [   ERROR] -", "ERROR", ""),
])
def test_a_level_padded_inside_brackets_before_a_dash_is_a_records_head(line, level, message):
    assert clean_record(line) == (message, (level, None))


@pytest.mark.parametrize("line", ["[2024-09-18 00:12:07] [INFO] hello", "[2024-09-18 00:12:07] [ INFO ] - x",
                                  "[note] [    INFO] - x"])
def test_other_bracketed_heads_are_not_that_record(line):
    assert clean_record(line)[1] is None


def test_its_training_header_with_its_figures_is_start_up():
    text = ("[2023-07-19 14:47:55,500] [    INFO] - ***** Running training *****\n"
            "[2023-07-19 14:47:55,501] [    INFO] -   Num examples = 4000\n"
            "[2023-07-19 14:47:55,501] [    INFO] -   Num Epochs = 9\n")
    d = diagnose(parse_text(text))
    assert (d.outcome, d.phase) == ("incomplete", "model_load")
