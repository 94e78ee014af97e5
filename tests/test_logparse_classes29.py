"""Classes behind batch 40's first-read misses, and older ones of the same kinds: a LoRA's weights gathered
for the save (peft's get_peft_model_state_dict) and a checkpoint compiled from them; a trainer saying its
loop is over; a model or its runtime failing to load; a Lightning script building its Trainer; logging's
time with AM/PM before each line; records with their level and logger in brackets or between bars. Several
forms of each, and text that must not be read so."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from tests.logparse_texts import BAR, CACHING, HEAD, OOM, frame, phase

_ERR = "AttributeError: 'NoneType' object has no attribute 'peft_config'\n"


@pytest.mark.parametrize("frames", [
    frame("/st/train.py", 2375, "main", "get_peft_model_state_dict(unet)"),
    frame("/d/train_dreambooth_lora.py", 1300, "main",
          "unet_lora_layers = convert_state_dict_to_diffusers(get_peft_model_state_dict(unet))"),
    frame("/ext/dreambooth/train_dreambooth.py", 1500, "inner_loop", "compile_checkpoint(model_name, lora_path=p)"),
    frame("/ext/dreambooth/train_dreambooth.py", 1500, "inner_loop", "x = f()")
    + frame("/ext/dreambooth/diff_to_sd.py", 422, "compile_checkpoint", "unet = load_unet(path)"),
])
def test_gathering_or_compiling_the_trained_weights_is_saving(frames):
    assert phase(BAR + HEAD + frames + _ERR) == "saving"


def test_setting_a_state_dict_back_is_not_saving():
    text = (HEAD + frame("/d/train.py", 800, "load_model_hook", "set_peft_model_state_dict(unet_, unet_state_dict)")
            + _ERR)
    assert phase(text) != "saving"


@pytest.mark.parametrize("line", [
    "2024-08-04 07:57:24,948 [INFO] (__main__) Exiting training loop. Beginning model unwind at epoch 250, step 500",
    "Exiting the training loop.",
    "Beginning model unwind at epoch 3, step 90",
])
def test_a_trainer_saying_its_loop_is_over_is_the_final_save(line):
    assert phase(BAR + line + "\n" + "AttributeError: 'NoneType' object has no attribute 'x'\n") == "saving"


@pytest.mark.parametrize("line", ["Exiting validation loop", "Not exiting training loop yet", "Beginning training"])
def test_other_exits_and_beginnings_are_not(line):
    assert phase(BAR + line + "\n") != "saving"


@pytest.mark.parametrize("line", ["Compiling checkpoint for Japanese girl...", "compiling checkpoint: x"])
def test_compiling_a_checkpoint_is_saving(line):
    d = diagnose(parse_text(BAR + line + "\n"))
    assert (d.outcome, d.phase) == ("incomplete", "saving")


@pytest.mark.parametrize("line", [
    "06/29/2023 03:28:28 AM  * Failed to load checkpoint *",
    "Failed to load ZLUDA: Could not find module 'C:\\ot\\.zluda\\hiprtc0507.dll'",
    "Failed to load the base model from /m/x.safetensors",
    "!! Failed to load VAE",
])
def test_a_model_or_its_runtime_failing_to_load_is_start_up(line):
    assert phase(line + "\n") == "model_load"


@pytest.mark.parametrize("line", ["Failed to load image /w/img/cat.png, skipping", "Failed to load caption for x.png",
                                  "failed to load sample prompt 3"])
def test_a_file_of_the_dataset_failing_to_load_is_not(line):
    assert phase(BAR + line + "\n") == "training"


@pytest.mark.parametrize("time", ["06/29/2023 03:28:28 AM ", "12/01/2024 3:05:09 PM  "])
def test_logging_time_with_am_or_pm_is_cut(time):
    # (A line's start is where the milestone words are looked for.)
    assert phase(BAR + time + "Compiling checkpoint for x\n") == "saving"


def test_other_text_after_a_date_is_not_cut():
    assert phase(BAR + "06/29/2023 03:28:28 XM Compiling checkpoint for x\n") == "training"


@pytest.mark.parametrize("source", ["trainer_kwargs['max_steps'] = trainer_opt.max_steps",
                                    "trainer_kwargs = dict()",
                                    "trainer_opt.gpus = '0,'",
                                    "trainer = Trainer.from_argparse_args(trainer_opt, **trainer_kwargs)"])
def test_a_lightning_script_building_its_trainer_is_start_up(source):
    text = HEAD + frame("main.py", 863, "<module>", source) + "KeyError: 'max_steps'\n"
    assert phase(text) == "model_load"


@pytest.mark.parametrize("source", ["if trainer_opt.max_steps == 0:", "log(trainer_options)"])
def test_reading_the_trainers_options_otherwise_is_not(source):
    text = CACHING + HEAD + frame("/w/x.py", 863, "f", source) + OOM
    assert phase(text) == "cache_latents"


@pytest.mark.parametrize("head", ["[2023-10-09 00:29:27,796][INFO][dreambooth.train_dreambooth] - ",
                                  "[2023-10-09 00:29:27][INFO][dreambooth.train_dreambooth] ",
                                  "2024-05-25 13:51:03,724 | INFO | /workspace/kohya_ss/kohya_gui/common_gui.py | ",
                                  "2024-05-25 13:51:03 | INFO     | trainer | "])
def test_records_with_level_and_logger_in_brackets_or_between_bars_are_read(head):
    d = diagnose(parse_text(BAR + head + "Saving weights to /out/x.safetensors\n"))
    assert (d.outcome, d.phase) == ("incomplete", "saving")
    # The logger's name may say the phase by itself.
    assert phase(head.replace("dreambooth.train_dreambooth", "musubi_tuner.cache_latents").replace(
        "/workspace/kohya_ss/kohya_gui/common_gui.py", "musubi_tuner.cache_latents").replace(
        "trainer", "musubi_tuner.cache_latents") + "found 4 images\n") == "cache_latents"


def test_an_error_record_in_brackets_is_the_failure():
    d = diagnose(parse_text("[2023-10-09 00:29:27,796][ERROR][dreambooth.train_dreambooth] - Exception training "
                            "model: CUDA out of memory. Tried to allocate 20.00 MiB\n"))
    assert d.outcome == "oom"


def test_a_logger_relogging_stderr_between_bars_is_still_that_output():
    lines = (HEAD + frame("/sd/train_network.py", 402, "train", "self.cache_text_encoder_outputs_if_needed(args)")
             + OOM).splitlines()
    text = "".join(f"2023-07-12 02:50:34 | ERROR | stderr | {line}\n" for line in lines)
    assert phase(text) == "cache_text_encoder"
