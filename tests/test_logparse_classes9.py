"""Classes behind batch 18's first-read misses: resuming a saved state and building the optimizer are
start-up; a trainer's own set-up methods outrank the modules they build; a validation pass named by
what it does, and logging its images, are sampling; a dataset looking up its cache files is start-up
unless a pass or a step is running; "Training failed" names the job, not a phase; Rich folds a frame
row after its path's colon. Several forms of each, and lines that must not be read as them."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from tests.logparse_texts import BAR, CACHING, HEAD, OOM, frame, phase

_ERR = "ValueError: something broke\n"


def _tb(*frames: str, error: str = _ERR) -> str:
    return HEAD + "".join(frames) + error


# ---- resuming a saved state, building the optimizer ----------------------------------------------------

@pytest.mark.parametrize("frames", [
    (frame("/sd/train_network.py", 400, "train", "train_util.resume_from_local_or_hf_if_specified(accelerator, args)"),
     frame("/venv/lib/accelerate/accelerator.py", 3000, "load_state")),
    (frame("/x/train_lora.py", 1208, "main", 'dirs = sorted(dirs, key=lambda x: int(x.split("-")[1]))'),),
    (frame("/x/train_dreambooth.py", 900, "main", "accelerator.load_state(os.path.join(args.output_dir, path))"),),
    (frame("/sd/train_network.py", 380, "train", "optimizer_name, optimizer_args, optimizer = train_util.get_optimizer(args, params)"),),
    (frame("/sd/library/train_util.py", 2699, "get_optimizer", "import bitsandbytes as bnb"),),
    (frame("/app/helpers/training/trainer.py", 4758, "init_validations", "self.validation = Validation("),
     frame("/app/helpers/training/validation.py", 2047, "__init__", "self.runs = build_runs(")),
])
def test_resuming_and_building_the_optimizer_are_start_up(frames):
    assert phase(CACHING + _tb(*frames)) == "model_load"


@pytest.mark.parametrize("frames, expected", [
    # Saving prunes its checkpoint folders with the same sort, under another name.
    ((frame("/x/train_lora.py", 1500, "main", 'checkpoints = sorted(checkpoints, key=lambda x: int(x.split("-")[1]))'),),
     ("unknown",)),
    # The optimizer's own step is the step's; its state is set up at the first step.
    ((frame("/venv/lib/bitsandbytes/optim/optimizer.py", 300, "init_state"),), ("first_step", "training")),
    # load_state_dict of a module is weights being loaded (start-up as well), not a state resumed.
    ((frame("/x/train.py", 10, "main", "model.load_state_dict(sd)"),), ("model_load",)),
])
def test_lookalikes_of_resuming_and_the_optimizer(frames, expected):
    assert phase(_tb(*frames)) in expected


@pytest.mark.parametrize("line", [
    "resume training from local state: /out/last-state",
    "use 8-bit AdamW optimizer | {}",
    "use Adafactor optimizer | {'relative_step': True}",
    "Creating optimizer AdamW",
    "Initializing the optimizer",
])
def test_resume_and_optimizer_lines_are_start_up(line):
    assert phase(CACHING + line + "\n" + OOM) == "model_load"


def test_a_resume_line_after_steps_is_not_start_up():
    assert phase(BAR + "resume training from local state: /out/last-state\n" + OOM) == "training"


# ---- validation --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("line", [
    "Processing validation prompts: 100%|██████████| 5/5 [00:35<00:00,  7.03s/it]",
    "Generating validation images",
    "Evaluating validation set",
    "Computing validation loss",
])
def test_a_validation_pass_named_by_what_it_does_is_sampling(line):
    assert phase(BAR + line + "\n" + _ERR) == "sampling"


@pytest.mark.parametrize("line", ["Validating lr scheduler arguments...", "validation_steps: 100"])
def test_checking_validation_settings_is_not_the_pass(line):
    assert phase(BAR + line + "\n" + _ERR) != "sampling"


@pytest.mark.parametrize("fn", ["log_validations", "log_validation"])
def test_logging_validation_images_is_sampling(fn):
    assert phase(_tb(frame("/x/train_sdxl.py", 1200, "main", f"{fn}(pipeline, args)"),
                     frame("/x/train_sdxl.py", 300, fn, "table.add_data(i, image)"))) == "sampling"


# ---- a dataset looking up its cache files ----------------------------------------------------------------------

_LOOKUP = "WARNING:dataset.image_video_dataset:Text encoder output cache file not found: /d/a_hv_te.safetensors\n"


def test_cache_files_looked_up_while_the_dataset_is_read_are_start_up():
    assert phase(_LOOKUP) == "model_load"
    assert phase("Latent cache file missing for /d/b.png\n") == "model_load"


@pytest.mark.parametrize("before, expected", [
    (BAR, "training"),  # a step reading its cache
    ("caching latents:  48%|████▊     | 10/21 [00:01<00:01, 7.00it/s]\n", "cache_latents"),  # the pass computing it
])
def test_cache_files_looked_up_inside_a_pass_or_a_step_keep_its_phase(before, expected):
    assert phase(before + _LOOKUP + OOM) == expected


# ---- "Training failed" names the job ---------------------------------------------------------------------------

@pytest.mark.parametrize("line", [
    "ERROR:trainer:Training failed: ValueError",
    "[INFO] Broadcasting error event for job 4dc5: Training failed: ValueError",
    "Training failed: CUDA error: an illegal memory access was encountered",
])
def test_training_failed_is_a_failure_without_a_phase(line):
    d = diagnose(parse_text(line + "\n"))
    assert d.outcome in ("error", "oom") and d.phase == "unknown"
    # What the run showed before it still places it.
    assert diagnose(parse_text(BAR + line + "\n")).phase == "training"


@pytest.mark.parametrize("line, expected", [
    ("ERROR:trainer:Training step failed: boom", "first_step"),
    ("Step 0: Training failed: MPS backend out of memory (MPS allocated: 45.18 GiB, other allocations: 719.81 MiB, "
     "max allowed: 45.90 GiB). Tried to allocate 23.44 MiB on private pool.", "first_step"),
    ("ERROR:trainer:Error during training: boom", "first_step"),
])
def test_a_step_or_during_training_still_names_the_step(line, expected):
    assert diagnose(parse_text(line + "\n")).phase == expected


# ---- Rich folds a frame row after its path's colon -------------------------------------------------------------

def test_a_rich_box_without_its_top_and_a_frame_row_folded_after_the_colon_is_a_cut_traceback():
    box = ("│                                                                                 │\n"
           "│ ❱ 2699 │   │   │   import bitsandbytes as bnb                                   │\n"
           "│                                                                                 │\n"
           "│ /venv/lib/python3.10/site-packages/bitsandbytes/__init__.py:                    │\n"
           "│ 5 in <module>                                                                   │\n"
           "│                                                                                 │\n"
           "│    3 # This source code is licensed under the MIT license found in the          │\n")
    d = diagnose(parse_text(box))
    assert (d.outcome, d.error.kind, d.phase) == ("error", "truncated", "model_load")


def test_a_box_row_that_only_ends_in_a_colon_is_not_joined_to_a_number_row():
    box = ("│ Loaded these files:                                                              │\n"
           "│ 5 in total                                                                        │\n")
    assert diagnose(parse_text(box)).error is None
