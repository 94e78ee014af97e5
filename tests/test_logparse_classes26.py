"""Classes behind batches 35 and 36's first-read misses: sd-scripts' standalone latent-caching script;
the accelerator's fp16 set-up; SimpleTuner configuring its data backends (a caching call below it says
more); SimpleTuner's and LyCORIS's start-up lines; Python's `-m` finding no module to run (the launcher
missing); a host printing the training script's path with spaces in it. Several forms of each, and
text that must not be read so."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from tests.logparse_texts import CACHING, HEAD, OOM, frame, phase

_ERR = "TypeError: bad\n"


@pytest.mark.parametrize("path", ["/sd/finetune/prepare_buckets_latents.py", "C:\\sd\\prepare_buckets_latents.py"])
def test_sd_scripts_latent_caching_script(path):
    text = HEAD + frame(path, 178, "main", "if train_util.is_disk_cached_latents_is_expected(reso, npz, flip):") + _ERR
    assert phase(text) == "cache_latents"


def test_the_accelerators_fp16_set_up_is_start_up():
    text = (HEAD + frame("/sd/train_textual_inversion.py", 260, "train",
                         "train_util.patch_accelerator_for_fp16_training(accelerator)")
            + "AttributeError: 'Accelerator' object has no attribute 'scaler'\n")
    assert phase(text) == "model_load"


_BACKEND = frame("/st/train.py", 588, "main", "configure_multi_databackend(args, accelerator)")


def test_simpletuner_configuring_its_data_backends_is_the_dataset_read():
    text = HEAD + _BACKEND + frame("/st/helpers/data_backend/factory.py", 700, "configure_multi_databackend",
                                   "raise Exception('No images were discovered')") + "Exception: No images\n"
    assert phase(text) == "model_load"


def test_a_caching_call_below_the_data_backends_says_more():
    text = (HEAD + _BACKEND + frame("/st/helpers/caching/vae.py", 300, "process_buckets", "self._process_images()")
            + OOM)
    assert phase(text) == "cache_latents"


@pytest.mark.parametrize("line", ["Configuring data backend: project-dataset", "Using rank adaptation algo: ia3",
                                  "Create LyCORIS Module"])
def test_start_up_lines_of_simpletuner_and_lycoris(line):
    # (after a caching pass under way, so that only the line can make it start-up)
    assert phase(CACHING + line + "\n" + OOM) == "model_load"


@pytest.mark.parametrize("line", [
    "C:\\Python310\\python.exe: Error while finding module specification for 'accelerate.commands.launch' "
    "(ModuleNotFoundError: No module named 'accelerate')",
    "/usr/bin/python3: Error while finding module specification for 'accelerate.commands.launch' "
    "(ModuleNotFoundError: No module named 'accelerate')",
])
def test_python_finding_no_module_to_run_is_a_start_up_failure(line):
    d = diagnose(parse_text(line + "\nTrain finished\n"))
    assert (d.outcome, d.phase) == ("error", "model_load")


def test_a_note_about_module_specifications_is_not():
    assert diagnose(parse_text("see the docs on module specification for details\n")).outcome == "incomplete"


@pytest.mark.parametrize("line", [
    "G:\\STABLE DIFUSION\\2. SD-COMFYUI\\ComfyUI\\custom_nodes\\Lora-Training-in-Comfy/sd-scripts/train_network.py",
    "/home/me/My Files/sd-scripts/sdxl_train_network.py",
])
def test_a_training_scripts_path_with_spaces(line):
    assert phase("got prompt\n" + line + "\nTrain finished\n") == "model_load"


@pytest.mark.parametrize("line", ["see the docs at /x/train_network.py", "edit my train_network.py"])
def test_prose_naming_a_training_script_is_not_its_launch(line):
    assert phase(line + "\n" + OOM) == "unknown"
