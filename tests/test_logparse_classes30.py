"""Classes behind batch 41's first-read misses: a training command's option lines, where a console wrapped the
command or cut its head; transformers' and diffusers' loaders naming what they could not load. Several forms of
each, and text that must not be read so (the option-line rule also on input built to make a pattern backtrack)."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from kohya_tuner.logparse.phase_words import phrase_phase
from tests.logparse_texts import BAR, CACHING, HEAD, frame, phase


@pytest.mark.parametrize("line", [
    '                         --max_train_steps="2847" --min_timestep=0              ',
    '--mixed_precision="bf16" --network_alpha="32"',
    "--network_dim=64 --network_module=lycoris.kohya --no_half_vae",
    "  --resolution=1024,1024 --cache_latents \\",
    '--optimizer_args decouple=True weight_decay=0.01 --optimizer_type="Prodigy"',
])
def test_a_training_commands_option_lines_are_the_launch(line):
    d = diagnose(parse_text(CACHING + line + "\n"))
    assert (d.outcome, d.phase) == ("incomplete", "model_load")


@pytest.mark.parametrize("line", [
    '--output_name="test"',  # one option alone: too little to say
    'conv_alpha="32" rank_dropout="0" bypass_mode="False"',
    "-- x --y",
    "--- --- ---",
    "------------------------------------------------------------",
    "usage is --foo --bar",
])
def test_other_lines_with_dashes_are_not(line):
    assert phase(CACHING + line + "\n") == "cache_latents"


@pytest.mark.parametrize("line", ["--a " * 3000 + "x", "--a b " * 2000 + "-", '--a="x y" ' * 2000 + '"',
                                  "--a=b" * 4000 + " ", "-- " * 5000, "--a" + " b" * 5000 + " c"])
def test_long_lines_shaped_to_make_the_pattern_backtrack_are_read_at_once(line):
    # The rule on the whole line (the parser reads a line's first 120 characters): were the pattern to
    # backtrack on these, this would not finish; none ends in an option, so none is the launch.
    assert phrase_phase(line.lower()) is None


@pytest.mark.parametrize("error", [
    "OSError: Can't load tokenizer for 'openai/clip-vit-large-patch14'. If you were trying to load it from "
    "'https://huggingface.co/models', make sure you don't have a local directory with the same name.",
    "OSError: Can't load the model for 'stabilityai/sdxl-vae'.",
    "OSError: Can't load config for '/m/unet'. Make sure that '/m/unet' is the correct path",
    "OSError: Can't load feature extractor for 'openai/clip-vit-base-patch32'.",
])
def test_a_loader_naming_what_it_could_not_load_is_start_up(error):
    d = diagnose(parse_text(error + "\n"))
    assert (d.outcome, d.phase) == ("error", "model_load")


def test_the_frames_and_the_lines_before_still_come_first():
    err = "OSError: Can't load the model for 'x'.\n"
    text = BAR + HEAD + frame("/sd/train_network.py", 1300, "train", "self.sample_images(accelerator, args)") + err
    assert phase(text) == "sampling"


@pytest.mark.parametrize("error", ["OSError: Can't load image /w/img/cat.png", "OSError: Cannot load the tokenizer"])
def test_other_loads_are_not_read_so(error):
    assert phase(error + "\n") == "unknown"
