"""Classes behind batches 25 and 26's first-read misses: PyTorch Lightning's `Epoch N:` bar is the
training bar; accelerate's notice of the options it filled with defaults is the launcher starting the
job; sd-scripts' `epoch is incremented` record is the training loop starting an epoch; sd-scripts'
`No data found` is its start-up dataset check; a forward pass in library frames alone says no stage;
a step fetching its batch through an iterator called with the step. Several forms of each, and text
that must not be read as them."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from tests.logparse_texts import CACHING, HEAD, OOM, frame, phase


@pytest.mark.parametrize("bar,want,step,total", [
    ("Epoch 0:   0%|          | 0/250 [00:00<?, ?it/s]", "first_step", 0, 250),
    ("Epoch 0:  12%|█▏        | 30/250 [00:10<01:10,  3.00it/s, v_num=0]", "training", 30, 250),
    ("Epoch 3:  40%|████      | 100/250 [00:10<00:15, 10.00it/s, v_num=1, train_loss=0.1]", "training", 100, 250),
    ("Epoch 2:   0%|          | 0/80 [00:00<?, ?it/s]", "training", 0, 80),
])
def test_lightnings_numbered_epoch_bar_is_the_training_bar(bar, want, step, total):
    d = diagnose(parse_text(bar + "\n" + OOM))
    assert (d.phase, d.step, d.total_steps) == (want, step, total)


@pytest.mark.parametrize("bar", [
    "epoch:   0%|          | 0/100 [00:00<?, ?it/s]",
    "Epochs:   0%|          | 0/10 [00:00<?, ?it/s]",
    "Epoch 0 of what: 10%|█         | 1/10 [00:00<?, ?it/s]",
])
def test_bars_of_epochs_are_not_the_step_bar(bar):
    assert diagnose(parse_text(bar + "\n" + OOM)).step is None


@pytest.mark.parametrize("notice", [
    "The following values were not passed to `accelerate launch` and had defaults used instead:",
    "The following values were not passed to accelerate launch and had defaults used instead:",
])
def test_accelerates_defaults_notice_is_the_launcher_starting(notice):
    rows = "\t`--num_processes` was set to a value of `1`\n\t`--mixed_precision` was set to a value of `'no'`\n"
    assert phase(notice + "\n" + rows + OOM) == "model_load"
    # the launcher reporting the trainer's exit right after it
    exit_line = ("subprocess.CalledProcessError: Command '['python', 'x.py']' returned non-zero exit status 1.\n")
    assert phase(notice + "\n" + rows + exit_line) == "model_load"


def test_the_notice_places_nothing_after_steps():
    bar = "steps:  10%|█         | 10/100 [00:10<00:50,  1.00it/s, avr_loss=0.1]\n"
    notice = "The following values were not passed to `accelerate launch` and had defaults used instead:\n"
    assert phase(bar + OOM + notice) == "training"


@pytest.mark.parametrize("record", [
    "epoch is incremented. current_epoch: 0, epoch: 1\n",
    "2024-09-15 19:05:01 INFO     epoch is incremented. current_epoch: 0, epoch: 1       train_util.py:672\n",
    "[2024-09-15 19:05:01] [INFO] INFO     epoch is incremented. current_epoch: 0, epoch: 1    train_util.py:672\n",
])
def test_sd_scripts_epoch_record_starts_the_training_loop(record):
    assert phase(record + OOM) == "first_step"
    assert phase(CACHING + record + OOM) == "first_step"


@pytest.mark.parametrize("line", [
    "No data found. Please verify arguments (train_data_dir must be the parent of folders with images) / "
    "画像がありません。引数指定を確認してください",
    "ERROR    No data found. Please verify arguments / 画像がありません。引数指定を確認してください   train_network.py:563",
])
def test_sd_scripts_empty_dataset_check_is_start_up(line):
    d = diagnose(parse_text("mean ar error (without repeats): nan\n" + line + "\n"))
    assert (d.outcome, d.phase) == ("error", "model_load")


_TORCH = (frame("/venv/lib/python3.10/site-packages/torch/nn/modules/module.py", 1553, "_wrapped_call_impl",
                "return self._call_impl(*args, **kwargs)")
          + frame("/venv/lib/python3.10/site-packages/diffusers/models/autoencoders/vae.py", 134, "forward",
                  "inputs = F.pad(inputs, padding_2d)"))


@pytest.mark.parametrize("prefix", ["", "[rank0]: "])
def test_a_forward_pass_in_library_frames_alone_says_no_stage(prefix):
    text = HEAD + _TORCH + OOM
    if prefix:
        text = "".join(prefix + line + "\n" for line in text.splitlines())
    assert phase(text) == "unknown"


@pytest.mark.parametrize("job", [
    frame("/home/u/my_trainer/train.py", 300, "training_step", "out = model(batch)"),
    frame("C:\\trainers\\lab\\models\\flux.py", 80, "forward", "x = self.block(x)"),
    frame("/workspace/kohya_ss/library/original_unet.py", 1500, "forward", "h = module(h)"),
])
def test_a_forward_pass_under_the_jobs_own_code_is_the_step(job):
    assert phase(HEAD + job + _TORCH + OOM) == "first_step"


@pytest.mark.parametrize("source", [
    "prepared_batch = self.prepare_batch(iterator_fn(step, *iterator_args))",
    "batch = data_iter_fn(step)",
    "prepared = self.prepare_batch(batch)",
])
def test_a_step_fetching_its_batch(source):
    text = HEAD + frame("/srv/SimpleTuner/helpers/training/trainer.py", 2097, "train", source) + "ValueError: bad\n"
    assert phase(text) == "first_step"


@pytest.mark.parametrize("source", [
    "batch = self.prepare_batch_for_validation(prompts)",
    "fn = make_iter_fn(config)",
])
def test_other_batch_calls_are_not_the_step(source):
    text = HEAD + frame("/srv/SimpleTuner/helpers/training/validation.py", 200, "run", source) + "ValueError: bad\n"
    assert phase(text) not in ("first_step", "training")
