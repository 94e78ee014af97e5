"""Classes of input other trainers and cut pastes give: a progress bar whose closing bracket is
missing, per-step records with no bar, a run's dataset records and a host application setting a
training run up (no phase yet), a traceback cut to a source line and its caret row, and a warning
the autograd engine raises. Every line is built from the printing library's format, never copied
from a labelled log; the negatives are lines that look alike and must not be read so."""

from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from kohya_tuner.logparse.events import Progress

OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
       "23.65 GiB of which 10.00 MiB is free.\n")


def _progress(text: str) -> list[Progress]:
    return [e for e in parse_text(text) if isinstance(e, Progress)]


# ---- a bar whose closing bracket is missing ---------------------------------------------------------

@pytest.mark.parametrize("line, step, total", [
    # The paste cut inside the postfix.
    ("Epoch 2:  40%|████      | 80/200 [01:10<01:45,  1.14it/s, loss=0.213, v_num=3", 80, 200),
    ("steps:  12%|█▏        | 120/1000 [02:00<14:40,  1.00s/it, avr_loss=0.104", 120, 1000),
    # tqdm in a notebook cell (no bar drawn), cut the same way.
    ("steps:   3% 30/1000 [00:30<16:10,  1.00it/s, avr_loss=0.2", 30, 1000),
    # Another message printed onto the bar's line before tqdm closed it.
    ("Epoch 0:   1%|          | 3/400 [00:09<20:00,  3.02s/it, loss=0.51, v_num=0, train/loss_sWARNING: disk is slow",
     3, 400),
])
def test_a_training_bar_cut_before_its_bracket_still_counts(line, step, total):
    d = diagnose(parse_text(line + "\n" + OOM))
    assert (d.phase, d.step, d.total_steps) == ("training", step, total)


def test_a_cut_bar_keeps_what_its_name_says():
    d = diagnose(parse_text("Caching latents:  40%|████      | 80/200 [00:10<00:15,  8.00it/s\n" + OOM))
    assert d.phase == "cache_latents"
    assert d.step is None


@pytest.mark.parametrize("line", [
    "Copied 40% 80/200 files",
    "done: 40% of 80/200 images checked",
])
def test_counts_in_prose_are_no_bar(line):
    assert _progress(line + "\n") == []


# ---- per-step training records with no bar --------------------------------------------------------

@pytest.mark.parametrize("line, step", [
    ("Epoch 3 | iter 1200 step 300 | loss train: 0.412, val: n/a | iter time: 410.2 ms", 300),
    ("step: 120, loss: 0.3120, lr: 1.0e-04", 120),
    ("Step 45 | loss 0.981 | grad_norm 1.2", 45),
    ("iteration 88, step 22, training loss 0.55", 22),
    ("global_step 80 | train_loss 0.2", 80),
])
def test_a_per_step_record_counts_its_step(line, step):
    text = "".join(f"{line.replace(str(step), str(step - k), 1)}\n" for k in (2, 1, 0))
    assert diagnose(parse_text(text)).step == step
    d = diagnose(parse_text(text + OOM))
    assert (d.phase, d.step) == ("training", step)


@pytest.mark.parametrize("line", [
    "step 5 of the setup: checking losses",
    "Step 300 | val loss 0.4",
    "step 10, loss_scale 65536",
    "Resumed at step 300, loss 0.2",
])
def test_lines_naming_a_step_are_no_step_record(line):
    assert _progress(line + "\n") == []


# ---- start-up before any model: dataset records, a host application setting a run up ----------------
# The job's start-up (`model_load`) is everything before its first step but caching; what a host
# printed before it set the run up (a web UI loading a checkpoint for inference) is not the run's.

_HOST_LOADED = ("Loading weights [0a1b2c3d] from /models/base.safetensors\n"
                "Creating model from config: /configs/v1-inference.yaml\n"
                "Model loaded in 2.1s (create model: 0.5s, apply weights to model: 1.0s).\n"
                "Running on local URL:  http://127.0.0.1:7860\n")


@pytest.mark.parametrize("setup", [
    "Initializing dreambooth training...",
    "Initialising LoRA training",
    "Initializing training",
])
def test_a_host_setting_a_run_up_starts_the_run(setup):
    d = diagnose(parse_text(_HOST_LOADED + setup + "\nThe conf"))
    assert (d.outcome, d.phase) == ("incomplete", "model_load")
    assert d.details.last_milestone == "setting a training run up"


def test_a_host_model_load_is_still_read_when_no_run_is_set_up():
    d = diagnose(parse_text(_HOST_LOADED + OOM))
    assert d.phase == "model_load"
    assert d.details.last_milestone != "setting a training run up"


@pytest.mark.parametrize("records", [
    "prepare tokenizer\nprepare images.\nfound directory /data/img contains 12 image files\nloading image sizes.\n"
    "100%|██████████| 12/12 [00:00<00:00, 100.00it/s]\n",
    "Loading dataset config from /data/dataset.toml\n",
    "Loading captions from /data/captions\n",
    "Loading images: 24 files\n",
])
def test_a_paste_cut_in_the_dataset_records_is_start_up(records):
    # After a caching pass, so that the phase can only come from the records.
    d = diagnose(parse_text("caching latents.\n" + records))
    assert (d.outcome, d.phase) == ("incomplete", "model_load")
    assert d.details.last_milestone == "reading the dataset"


@pytest.mark.parametrize("after, phase", [
    ("Loading VAE from /models/vae.safetensors\n", "model_load"),
    ("caching latents.\n", "cache_latents"),
    # A training header is start-up's end until the loop shows (the convention's training-header clause).
    ("Starting training...\n", "model_load"),
    ("Starting training...\nsteps:   0%|          | 0/100 [00:00<?, ?it/s]\n", "first_step"),
])
def test_what_follows_the_dataset_records_says_the_phase(after, phase):
    d = diagnose(parse_text("loading image sizes.\nmake buckets\n" + after + OOM))
    assert d.phase == phase


# ---- a traceback cut to a source line and its caret row -----------------------------------------------

@pytest.mark.parametrize("source, carets, phase", [
    ("    loss.backward()", "    ^^^^^^^^^^^^^^^", ("first_step", "training")),
    ("    latents = vae.encode(pixels).latent_dist.sample()", "              ~~~~~~~~~~^^^^^^^^", ("cache_latents",)),
    ("    images = pipe(prompt, num_inference_steps=20)", "             ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
     ("sampling",)),
    (" return Variable._execution_engine.run_backward(  # the engine",
     "        ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^", ("first_step", "training")),
])
def test_a_source_line_over_its_caret_row_is_a_frame(source, carets, phase):
    d = diagnose(parse_text(f"{source}\n{carets}\n{OOM}"))
    assert d.phase in phase
    assert d.details.phase_evidence == "frames"


@pytest.mark.parametrize("text", [
    # The caret row is not right under the indented line.
    "    loss.backward()\n\n    ^^^^^^^^^^^^^^^\n",
    "    loss.backward()\nsome record\n    ^^^^^^^^^^^^^^^\n",
    # Not indented: not a traceback's source line.
    "loss.backward() is where it fails\n^^^^^^^^^^^^^^^\n",
])
def test_a_caret_row_alone_makes_no_frame(text):
    assert diagnose(parse_text(text + OOM)).phase == "unknown"


# ---- a warning raised by the autograd engine --------------------------------------------------------

@pytest.mark.parametrize("where", [
    "/venv/lib/python3.10/site-packages/torch/autograd/graph.py:744",
    "C:\\env\\Lib\\site-packages\\torch\\autograd\\graph.py:825",
])
def test_a_warning_from_the_autograd_engine_says_a_backward_pass_runs(where):
    text = (f"{where}: UserWarning: Some grads were materialized (Triggered internally at ../aten/x.cpp:10.)\n"
            "  return Variable._execution_engine.run_backward(\n")
    d = diagnose(parse_text("Loading model from /models/m.safetensors\n" + text))
    assert (d.outcome, d.phase) == ("incomplete", "first_step")
    bar = "steps:  10%|█         | 10/100 [00:10<01:30,  1.00it/s, avr_loss=0.1]\n"
    assert diagnose(parse_text(bar + "generating sample images at step 10\n" + text + OOM)).phase == "training"


@pytest.mark.parametrize("before, warning, phase", [
    ("generating sample images\n", "/venv/lib/python3.10/site-packages/torch/utils/checkpoint.py:61: UserWarning: "
     "None of the inputs have requires_grad=True. Gradients will be None", "sampling"),
    ("caching latents.\n", "/venv/lib/python3.10/site-packages/torch/nn/modules/module.py:1367: UserWarning: "
     "expandable_segments not supported on this platform", "cache_latents"),
    ("caching latents.\n", "/venv/lib/python3.10/site-packages/torch/autograd/grad_mode.py:12: FutureWarning: "
     "no_grad is deprecated", "cache_latents"),
])
def test_other_warnings_say_no_phase(before, warning, phase):
    assert diagnose(parse_text(before + warning + "\n" + OOM)).phase == phase
