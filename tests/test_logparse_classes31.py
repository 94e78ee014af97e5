"""Classes behind batches 42 and 43's first-read misses: torch's report of a state dict's keys with its head
line cut; sd-scripts' fine-tuning metadata missing; the loop averaging its loss across ranks; accelerate's
launcher warning of a deprecated flag; the data loader's own frames alone (no stage); a logger named for its
package naming the program that logs. Several forms of each, and text that must not be read so."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from tests.logparse_texts import BAR, CACHING, HEAD, OOM, box_row, frame, phase


@pytest.mark.parametrize("line", [
    '        Missing key(s) in state_dict: "lora_te_text_model_encoder_layers_0_self_attn_k_proj.weight", "x.bias"',
    "\tUnexpected key(s) in state_dict: 'model.diffusion_model.input_blocks.0.0.weight'.",
    'Missing key(s) in state_dict: "a.weight".',
])
def test_a_state_dicts_key_report_without_its_head_is_the_failure_loading_weights(line):
    d = diagnose(parse_text(line + "\n"))
    assert (d.outcome, d.phase) == ("error", "model_load")


@pytest.mark.parametrize("line", [
    "missing keys: ['a.weight']",
    "_IncompatibleKeys(missing_keys=['a.weight'], unexpected_keys=[])",
    "load network weights: Missing key(s) in state_dict are ignored",
])
def test_other_lines_about_missing_keys_are_not_a_failure(line):
    d = diagnose(parse_text(CACHING + line + "\n"))
    assert d.outcome == "incomplete"


@pytest.mark.parametrize("error", [
    "ValueError: no metadata / メタデータファイルがありません: /meta_lat.json",
    "ValueError: no metadata / メタデータファイルがありません: D:\\\\t\\\\meta_cap.json",
])
def test_sd_scripts_fine_tuning_metadata_missing_is_start_up(error):
    text = "    raise ValueError(f\"no metadata / メタデータファイルがありません: {subset.metadata_file}\")\n" + error + "\n"
    d = diagnose(parse_text(text))
    assert (d.outcome, d.phase) == ("error", "model_load")


@pytest.mark.parametrize("source", ["dist.all_reduce(avg_loss, op=dist.ReduceOp.SUM)", "torch.distributed.all_reduce(loss)",
                                    "dist.all_reduce( train_loss_sum )"])
def test_the_loop_averaging_its_loss_across_ranks_is_the_step(source):
    text = HEAD + frame("/o/train.py", 239, "main", source) + frame(
        "/venv/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py", 1700, "all_reduce",
        "default_pg = _get_default_group()") + "ValueError: Default process group has not been initialized\n"
    assert phase(text) == "first_step"
    assert phase(BAR + text) == "training"


@pytest.mark.parametrize("source", ["dist.all_reduce(counts)", "dist.all_reduce(lossless_tensor)", "dist.all_reduce(loss_scale_factor)"])
def test_reducing_anything_else_is_not_it(source):
    text = CACHING + HEAD + frame("/o/x.py", 239, "f", source) + OOM
    assert phase(text) == "cache_latents"


@pytest.mark.parametrize("line", [
    "ipex flag is deprecated, will be removed in Accelerate v1.10. From 2.7.0, PyTorch has all needed optimizations",
    "The `--use_cpu` flag is deprecated, will be removed in Accelerate v2.0.",
])
def test_accelerates_launcher_warning_of_a_deprecated_flag_is_the_launch(line):
    d = diagnose(parse_text(CACHING + line + "\n"))
    assert (d.outcome, d.phase) == ("incomplete", "model_load")


@pytest.mark.parametrize("line", ["The foo flag is deprecated.", "ipex flag is deprecated, will be removed in v2"])
def test_other_deprecations_are_not(line):
    assert phase(CACHING + line + "\n") == "cache_latents"


def test_the_data_loaders_own_rows_alone_say_no_stage():
    text = (box_row("/venv/lib/python3.10/site-packages/torch/utils/data/dataloader.py:634 in __next__")
            + box_row("❱  634 │   │   │   data = self._next_data()")
            + box_row("/venv/lib/python3.10/site-packages/torch/utils/data/dataloader.py:1346 in _next_data"))
    d = diagnose(parse_text(text))
    assert d.phase == "unknown"


def test_under_the_jobs_loop_they_are_the_step():
    text = (HEAD + frame("/sd/train_network.py", 900, "train", "for step, batch in enumerate(train_dataloader):")
            + frame("/venv/lib/python3.10/site-packages/torch/utils/data/dataloader.py", 634, "__next__",
                    "data = self._next_data()") + "RuntimeError: DataLoader worker (pid 42) is killed\n")
    assert phase(text) == "first_step"


@pytest.mark.parametrize("logger, wrapper", [
    ("musubi_tuner.hv_train_network", "musubi-tuner"),
    ("musubi_tuner.wan_train_network", "musubi-tuner"),
    ("__main__", "sd-scripts"),
    ("library.config_util", "sd-scripts"),
])
def test_a_logger_named_for_its_package_names_the_program(logger, wrapper):
    text = f"prepare optimizer, data loader etc.\nINFO:{logger}:use 8-bit AdamW optimizer | {{}}\n"
    assert diagnose(parse_text(text)).wrapper == wrapper
