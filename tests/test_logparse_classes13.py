"""Classes behind batch 22's first-read misses: ComfyUI's report of a node's exception is the failure,
and an error naming the call that failed places it; a caching loop named in its own source line;
libraries' start-up records and download bars named by a file; loading a pipeline during a sample
between steps is the sample; the total steps written with ':' or '='. Several forms of each, and text
that must not be read as them."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from tests.logparse_texts import BAR, CACHING, HEAD, OOM, frame, phase


# ---- ComfyUI's report of a node's exception; an error naming the call that failed -----------------------

@pytest.mark.parametrize("before, call, expected", [
    (BAR, "FluxNetworkTrainer.sample_images() takes 4 positional arguments but 10 were given", "sampling"),
    (BAR, "save_model() got an unexpected keyword argument 'x'", "saving"),
    ("", "cache_text_encoder_outputs() missing 1 required positional argument: 'y'", "cache_text_encoder"),
])
def test_comfyuis_exception_report_naming_the_call_places_it(before, call, expected):
    d = diagnose(parse_text(before + f"!!! Exception during processing !!! {call}\n"))
    assert (d.outcome, d.phase) == ("error", expected)


def test_comfyuis_exception_report_naming_no_known_call_is_a_failure_without_a_phase():
    d = diagnose(parse_text("!!! Exception during processing !!! 'NoneType' object has no attribute 'shape'\n"))
    assert (d.outcome, d.phase) == ("error", "unknown")


@pytest.mark.parametrize("line", ["ERROR: some_helper() takes 2 positional arguments but 3 were given"])
def test_a_call_error_naming_no_phase_function_places_nothing(line):
    assert diagnose(parse_text(line + "\n")).phase == "unknown"


# ---- a caching loop named in its own source line ------------------------------------------------------

@pytest.mark.parametrize("source, expected", [
    ('for batch in tqdm(train_dataloader, desc="Caching latents"):', "cache_latents"),
    ("for batch in tqdm(loader, desc='Encoding latents'):", "cache_latents"),
    ('for batch in tqdm(loader, desc="Caching text embeddings"):', "cache_text_encoder"),
])
def test_a_loop_named_for_caching_in_its_source_line_is_caching(source, expected):
    text = (HEAD + frame("/x/train_dreambooth.py", 700, "main", source)
            + frame("/venv/lib/torch/utils/data/dataloader.py", 630, "__next__") + OOM)
    assert phase(text) == expected


def test_a_loop_named_for_training_is_not_caching():
    text = (HEAD + frame("/x/train.py", 700, "main", 'for batch in tqdm(train_dataloader, desc="Training"):')
            + frame("/venv/lib/torch/utils/data/dataloader.py", 630, "__next__") + OOM)
    assert phase(text) != "cache_latents"


# ---- libraries' start-up records, download bars named by a file ----------------------------------------

@pytest.mark.parametrize("line", [
    "You are using a model of type clip_text_model to instantiate a model of type . This is not supported.",
    "{'variance_type', 'clip_sample_range'} was not found in config. Values will be initialized to default values.",
    "Distributed environment: NO",
    "TensorBoard 2.15.1 at http://localhost:6006/ (Press CTRL+C to quit)",
])
def test_library_start_up_records_are_start_up(line):
    assert phase(CACHING + line + "\n" + OOM) == "model_load"


@pytest.mark.parametrize("line", [
    "  tokenizer_2/tokenizer_config.json: 100%|██████████| 20.8k/20.8k [00:00<00:00, 141MB/s]",
    "spiece.model:  40%|████      | 317k/792k [00:00<00:00, 5.00MB/s]",
    "diffusion_pytorch_model.safetensors:  12%|█▏        | 400M/3.35G [00:10<01:10, 41.0MB/s]",
])
def test_download_bars_named_by_a_file_are_start_up(line):
    # After a validation pass that no step preceded: only the bar can make it start-up.
    assert phase("Running validation...\n" + line + "\n" + OOM) == "model_load"


@pytest.mark.parametrize("line", [
    "rank_0_mp_rank_00_model_states.pt",  # a wrapped path on a line of its own, not a bar
    "config.json",
])
def test_a_file_name_alone_is_not_a_download(line):
    assert phase(CACHING + line + "\n" + OOM) == "cache_latents"


# ---- a pipeline built during a sample between steps; totals with ':' or '=' ----------------------------

def test_loading_during_a_validation_pass_between_steps_is_the_pass():
    text = (BAR + "Running validation...\n"
            "{'controlnet', 'image_encoder'} was not found in config. Values will be initialized to default values.\n"
            "Loading pipeline components...: 100%|██████████| 9/9 [00:01<00:00,  6.00it/s]\n" + OOM)
    assert phase(text) == "sampling"


def test_loading_after_a_sample_before_any_step_is_start_up():
    text = ("Generating samples before training\nLoading VAE from /m/vae.safetensors\n" + OOM)
    assert phase(text) == "model_load"


@pytest.mark.parametrize("line", ["  total optimization steps: 10000", "  Total optimization steps = 10000",
                                  "  total optimization steps / 学習ステップ数: 10000"])
def test_the_total_steps_in_every_form(line):
    assert diagnose(parse_text(line + "\n")).total_steps == 10000
