"""Classes behind older held-out misses, taken after batches 98 to 105 were read: a launch from bash's default
prompt (`[user@host dir]$`) or with environment assignments before the command; sd-scripts' bucket summary; a job
creating its Hub repository or the cloud machine it runs on; a trainer choosing which weights train; a dataset's
configuration refused; an error whose subject is a command-line option; a stream tag padded inside its brackets.
Several forms of each, and text that must not be read so."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse.cleaning import clean
from tests.logparse_texts import BAR, HEAD, frame, phase


@pytest.mark.parametrize("line", [
    "(flux) [wangxi@v100-4 SimpleTuner]$ CUDA_VISIBLE_DEVICES=2 sh train.sh",
    "[root@gpu01 ~]# bash train_lora.sh",
    "user@box:~/sd-scripts$ CUDA_VISIBLE_DEVICES=0 HF_HOME=/data/hf accelerate launch train_network.py --config x.toml",
    "[me@host work]$ PYTHONPATH=. python train.py --config configs/a.yaml",
])
def test_a_launch_from_a_prompt_with_assignments_is_start_up(line):
    assert phase(line + "\n") == "model_load"


@pytest.mark.parametrize("line", [
    "[wangxi@v100-4 SimpleTuner]$ ls -la",
    "[root@gpu01 ~]# nvidia-smi",
    "CUDA_VISIBLE_DEVICES=2 is set",
])
def test_other_prompt_lines_say_no_stage(line):
    assert phase(line + "\n") == "unknown"


@pytest.mark.parametrize("lines", [
    ["mean ar error (without repeats): 0.00029235223036407505"],
    ["bucket 0: resolution (512, 512), count: 40", "mean ar error (without repeats): 0.0"],
])
def test_sd_scripts_bucket_summary_is_start_up(lines):
    assert phase("\n".join(lines) + "\n") == "model_load"


@pytest.mark.parametrize("source, func", [
    ("repo_id = create_repo(", "main"),
    ("self.cloud.setup()", "start"),
    ("pod = runpod.create_pod(", "_create"),
])
def test_setting_up_where_the_job_runs_or_publishes_is_start_up(source, func):
    text = HEAD + frame("/w/train_dreambooth_lora_sdxl.py", 919, func, source) + "ValueError: not found\n"
    assert phase(text) == "model_load"


def test_uploading_at_the_end_is_not_that():
    text = HEAD + frame("/w/train_dreambooth_lora_sdxl.py", 1900, "main", "upload_folder(") + "ValueError: x\n"
    assert phase(text) != "model_load"


@pytest.mark.parametrize("source", ["t_enc.text_model.embeddings.requires_grad_(True)", "unet.requires_grad_(False)"])
def test_choosing_which_weights_train_is_start_up(source):
    text = (HEAD + frame("/w/sd-scripts/train_network.py", 1200, "<module>", "trainer.train(args)")
            + frame("/w/sd-scripts/train_network.py", 595, "train", source) + "AttributeError: x\n")
    assert phase(text) == "model_load"


def test_a_loop_toggling_weights_is_still_the_loop():
    text = (HEAD + frame("/w/train.py", 700, "train", "loss = process_batch(batch)")
            + frame("/w/train.py", 300, "process_batch", "text_encoder.requires_grad_(train_te)") + "AttributeError: x\n")
    assert phase(BAR + text) == "training"


@pytest.mark.parametrize("line", [
    "ValueError: Your dataloader config must contain at least one image dataset AND at least one text_embed dataset.",
    "ValueError: Failed to load data backends: `file_name` or `*_file_name` must be present in metadata files",
])
def test_a_dataset_configuration_refused_is_start_up(line):
    assert phase(HEAD + frame("/usr/lib/python3/site-packages/x.py", 10, "f") + line + "\n") == "model_load"


@pytest.mark.parametrize("line", [
    "ValueError: --caption_column' value 'text' needs to be one of: image",
    "ValueError: --resolution_buckets must be divisible by 8",
    "AssertionError: --network_weights is required when resuming",
    "ValueError: `--train_data_dir` is not a valid folder",
])
def test_an_error_about_a_command_line_option_is_start_up(line):
    assert phase(HEAD + frame("/usr/lib/python3/site-packages/x.py", 10, "f") + line + "\n") == "model_load"


@pytest.mark.parametrize("line", [
    "Exception: Some images were not correctly cached during the VAE Cache operations. Ensure "
    "--skip_file_discovery=vae is not set.",
    "RuntimeError: CUDA error: out of resources. Try --lowvram_mode next time.",
])
def test_an_option_named_as_advice_is_not_an_argument_check(line):
    assert phase(HEAD + frame("/usr/lib/python3/site-packages/x.py", 10, "f") + line + "\n") != "model_load"


@pytest.mark.parametrize("line, rest", [
    ("2023-09-04 08:11:57.460 [stderr   ] ValueError: x", "ValueError: x"),
    ("2023-09-04 08:11:57.460 [stdout] INFO x", "INFO x"),
    ("[INFO    ] x", "x"),
])
def test_a_stream_or_level_tag_padded_in_its_brackets_is_taken_off(line, rest):
    assert clean(line) == rest
