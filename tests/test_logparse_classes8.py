"""Classes of start-up text that batch 17's first read did not recognise: Rich records at any indent,
argparse's usage text, a job's settings printed by name, a cache of image sizes, and sd-scripts' fatal
message relayed without its level. Several forms of each, and lines that must not be read as them."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from kohya_tuner.logparse.events import Failure, Milestone
from tests.logparse_texts import BAR, CACHED, OOM, phase



def _milestones(text: str) -> list[str]:
    return [e.name for e in parse_text(text) if isinstance(e, Milestone)]


# ---- a Rich record whose time column was cut to another width --------------------------------------------

@pytest.mark.parametrize("indent", [1, 4, 12, 16, 19])
def test_a_rich_record_at_any_indent_is_read(indent):
    line = " " * indent + "INFO     make buckets                                   train_util.py:1010\n"
    assert _milestones(CACHED + line)[-1] == "reading the dataset"


@pytest.mark.parametrize("line", [
    "    INFO is what the user typed                                   ",  # no source column
    "    Details: make buckets train_util.py:1010",  # no level
    '  File "/sd/train_util.py", line 1010, in make_buckets',  # a frame
])
def test_an_indented_line_without_level_and_source_is_no_record(line):
    assert "reading the dataset" not in _milestones(line + "\n")


# ---- argparse's usage text -----------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "usage: train_network.py [-h] [--v2] [--v_parameterization]\n",
    "usage: sdxl_train_network.py [-h] [--console_log_level {DEBUG,INFO,WARNING,ERROR,CRITICAL}]\n",
    "usage: /opt/sd-scripts/flux_train_network.py [-h]\n",
    "                        [--output_name OUTPUT_NAME] [--max_train_steps MAX_TRAIN_STEPS]\n",
    "  [--mixed_precision {no,fp16,bf16}] [--full_fp16] [--full_bf16]\n",
    "  [--network_args [NETWORK_ARGS ...]] [--network_dim NETWORK_DIM]\n",
])
def test_argparse_usage_text_is_reading_the_arguments(text):
    assert _milestones(CACHED + text)[-1] == "reading the arguments"
    assert phase(CACHED + text) == "model_load"


@pytest.mark.parametrize("line", [
    "[-1] is the last element",
    "[--output_name] was ignored",  # one group, then prose
    "Usage: 12 GiB of 24 GiB",
    "usage: see the docs",
])
def test_brackets_and_usage_words_that_are_not_usage_text(line):
    assert "reading the arguments" not in _milestones(BAR + line + "\n")


# ---- a job's settings printed by name ------------------------------------------------------------------------

@pytest.mark.parametrize("line", [
    "network_dim: 32",
    "| network_dim                   | 128                                                   |",
    "lr_warmup_steps = 0",
    "caption_extension: .txt",
    "gradient_accumulation_steps : 4",
])
def test_a_setting_printed_by_name_is_start_up(line):
    assert _milestones(CACHED + line + "\n")[-1] == "the job's settings printed"
    assert phase(CACHED + line + "\n" + OOM) == "model_load"


@pytest.mark.parametrize("line", [
    "sample_sampler: euler_a",  # sampling prints its own settings
    "avr_loss: 0.1",  # not an argument
    "grad_norm = 1.2",
    "image_count: 4",
    "  caption_extension: .txt",  # a row of a record's indented body, placed by its head
])
def test_other_named_values_are_no_setting(line):
    assert "the job's settings printed" not in _milestones(CACHED + line + "\n")


def test_settings_printed_after_steps_are_a_summary():
    assert phase(BAR + "network_dim: 32\nlearning_rate: 0.0001\n" + OOM) == "training"


# ---- a cache of image sizes is the dataset --------------------------------------------------------------------

@pytest.mark.parametrize("line, expected", [
    ("caching resolutions:  48%|████▊     | 10/21 [00:00<00:00, 300.00it/s]", "model_load"),
    ("Caching image sizes", "model_load"),
    ("caching metadata for 24 images", "model_load"),
    ("caching latents:  48%|████▊     | 10/21 [00:01<00:01, 7.00it/s]", "cache_latents"),
])
def test_a_cache_of_image_sizes_is_the_dataset_read(line, expected):
    # After a latent-caching bar still running: only the line under test can make it start-up.
    caching = "Loading VAE from v.safetensors\ncaching latents:  48%|████▊     | 10/21 [00:01<00:01, 7.00it/s]\n"
    assert phase(caching + line + "\n" + OOM) == expected


# ---- sd-scripts' fatal message relayed without its level ----------------------------------------------------

@pytest.mark.parametrize("line", [
    "No data found. Please verify arguments (train_data_dir must be the parent of folders with images)",
    "No data found. Please verify arguments / 画像がありません。引数指定を確認してください",
])
def test_no_data_found_without_a_level_ends_the_run(line):
    d = diagnose(parse_text("make buckets\n" + line + "\nTraining finished\n"))
    assert (d.outcome, d.error.kind, d.phase) == ("error", "missing_file", "model_load")


@pytest.mark.parametrize("line", [
    "No data found in cache for prompt 3, encoding it",
    "no data found yet, waiting",
])
def test_other_no_data_lines_without_a_level_are_no_failure(line):
    assert not any(isinstance(e, Failure) for e in parse_text(line + "\n"))
