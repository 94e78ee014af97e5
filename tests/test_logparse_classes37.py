"""Classes behind batches 54 to 57's first-read misses: a program's report of where it failed followed by a
traceback cut before its error line; a configuration's validation (not a validation pass); a program failing
to start the training; a launcher's `[RANK 0] ` tag; a caching script the interpreter cannot open; the words
of programs that start the job (training started, its accelerate launch, a dataset created, a backend
configured, arguments validated, a cache folder cleared, LyCORIS created, a caching pass under another name);
samples generated under another name; SimpleTuner's VAE cache and diffusion-pipe's caching; the arguments
parsed at the top of `main`. Several forms of each, and text that must not be read so."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from kohya_tuner.logparse.cleaning import clean
from tests.logparse_texts import BAR, CACHING, HEAD, frame, phase


def test_a_report_then_a_cut_traceback_is_placed_by_the_traceback():
    text = ("Exception while training: None is of type: <class 'NoneType'>, but should be <class 'ModelMixin'>\n"
            + HEAD + frame("G:\\w\\dreambooth\\train_dreambooth.py", 955, "main",
                           "save_weights(lifetime_step, save_model, save_img)")
            + '  File "G:\\w\\dreambooth\\train_dreambooth.py", line 812, in save_weights\n'
            + "    pipeline = StableDiffusi\n")
    d = diagnose(parse_text(text))
    assert (d.phase, d.error.kind) == ("saving", "other")


def test_a_report_then_a_cut_traceback_that_says_nothing_keeps_the_reports_words():
    text = ("Exception while training: bad value\n" + HEAD
            + frame("/v/lib/site-packages/torch/nn/modules/module.py", 1511, "_wrapped_call_impl", "return f(x)"))
    assert diagnose(parse_text(text)).phase in ("first_step", "training")


@pytest.mark.parametrize("line", ["RuntimeError: Configuration validation failed: Project name is required.",
                                  "ValueError: Config validation failed: resolution missing",
                                  "[ERROR] Failed to auto-start training: Configuration validation failed: x"])
def test_a_configurations_validation_is_start_up_not_a_validation_pass(line):
    assert phase(line + "\n") == "model_load"


@pytest.mark.parametrize("line", ["Validation failed: CUDA out of memory", "Error during validation: bad image"])
def test_a_validation_pass_failing_is_still_sampling(line):
    assert phase(BAR + line + "\n") == "sampling"


@pytest.mark.parametrize("line", ["Failed to start training: port in use", "failed to launch the job",
                                  "Failed to auto-start training: no dataset"])
def test_a_program_failing_to_start_the_training_is_start_up(line):
    d = diagnose(parse_text(line + "\n"))
    assert (d.outcome, d.phase) == ("error", "model_load")


def test_failing_to_start_something_else_is_not():
    assert phase(BAR + "failed to start tensorboard: port in use\n") == "training"


@pytest.mark.parametrize("tag", ["[RANK 0] ", "[Rank 1] ", "[rank 3] "])
def test_a_launchers_rank_tag_is_taken_off(tag):
    assert clean(tag + "2026-05-29 03:42:56,870 [INFO] hello").endswith("hello")
    assert clean(tag + "Loading model").startswith("Loading")


@pytest.mark.parametrize("first, second, expected", [
    ("wan_cache_latents.py", "wan_cache_text_encoder_outputs.py", "cache_latents"),
    ("cache_text_encoder_outputs.py", "cache_latents.py", "cache_text_encoder"),
])
def test_a_caching_script_the_interpreter_cannot_open_is_that_pass_failing(first, second, expected):
    py = "C:\\Python310\\python.exe"
    text = "".join(f"{py}: can't open file 'F:\\\\m\\\\{s}': [Errno 2] No such file or directory\n"
                   for s in (first, second))
    d = diagnose(parse_text(text))
    assert (d.outcome, d.error.kind, d.phase) == ("error", "other", expected)


def test_a_helper_script_the_interpreter_cannot_open_says_no_pass():
    text = "python3: can't open file '/w/convert_lora.py': [Errno 2] No such file or directory\n"
    assert phase(text) == "unknown"


@pytest.mark.parametrize("line", [
    "Training started with config file / 训练开始，使用配置文件: C:\\x\\autosave\\a.toml",
    "Accelerate launch mixed_precision=bf16 (from TOML); sd-scripts",
    "Creating dataset",
    "Configured backend: {'id': 'yearbook-512', 'dataset_type': 'image'}",
    "starting validation of args...",
    "failed validation",
    "Clearing cache directory L:/temp/Cache!",
    "[LyCORIS]-INFO: create LyCORIS: 0 modules.",
])
def test_the_words_of_a_program_starting_the_job_are_start_up(line):
    assert phase(CACHING + line + "\n") == "model_load"


@pytest.mark.parametrize("line", ["Training started 3 hours ago according to the log", "Accelerate launched fine"])
def test_other_words_like_them_do_not_restart_a_running_job(line):
    d = diagnose(parse_text(BAR + line + "\n"))
    assert d.phase in ("training", "first_step")


def test_a_caching_pass_under_another_name_owns_the_loading_after_it():
    text = ("Starting cache preparation...\nCache Preparation STDERR: Loading VAE model from C:/m/wan_vae.pth\n"
            "INFO:root:loading C:/m/wan_vae.pth\n")
    assert phase(text) == "cache_latents"


@pytest.mark.parametrize("line", ["Generating baseline samples before training", "Generating validation samples",
                                  "Generating samples"])
def test_samples_generated_under_another_name_are_sampling(line):
    assert phase(BAR + line + "\n") == "sampling"


@pytest.mark.parametrize("path, func, source", [
    ("/vol/SimpleTuner/helpers/caching/vae.py", "_process_images_in_batch", "pixel_values = self.transform(i).to("),
    ("/w/diffusion-pipe/train.py", "<module>", "dataset_manager.cache()"),
])
def test_simpletuners_vae_cache_and_diffusion_pipes_caching_are_the_latent_cache(path, func, source):
    assert phase(HEAD + frame(path, 833, func, source) + "TypeError: x\n") == "cache_latents"


@pytest.mark.parametrize("source", ["args = parse_args()", "args = helpers.arguments.parse_args()"])
def test_the_arguments_parsed_at_the_top_of_main_are_start_up(source):
    text = (HEAD + frame("/workspace/SimpleTuner/train.py", 277, "main", source)
            + frame("/workspace/SimpleTuner/helpers/arguments.py", 1983, "parse_args", "x = y")
            + "UnboundLocalError: cannot access local variable 'm'\n")
    assert phase(text) == "model_load"
