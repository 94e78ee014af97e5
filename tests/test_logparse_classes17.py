"""A Rich traceback box cut inside a function of the job's own code, below whole rows of its source:
with no rule reading those rows, no step counted and nothing else said, start-up by the convention
(tests/data/public_logs/README.md). The comments that mark a diffusers-style training step, among a
box's rows, are the step. Several forms of each, and boxes that must not be read so."""
from __future__ import annotations

import pytest

from tests.logparse_texts import BAR, CACHING, phase

_W = 98


def _row(text: str) -> str:
    return "│ " + text.ljust(_W - 1) + "│\n"


def box(*frames: tuple[str, int, str, list[tuple[int, str]]]) -> str:
    """A Rich traceback box as a paste cuts it: its header, each frame's row and source rows, and no
    bottom edge or error line."""
    out = "╭" + "─" * 31 + " Traceback (most recent call last) " + "─" * 32 + "╮\n"
    for i, (path, line, func, rows) in enumerate(frames):
        if i:
            out += _row("")
        out += _row(f"{path}:{line} in {func}") + _row("")
        for n, code in rows:
            out += _row(f"  {n} │   {code}" if code else f"  {n}")
    return out


_ENTRY = ("C:\\kohya_ss\\sdxl_train_network.py", 167, "<module>",
          [(166, "trainer = SdxlNetworkTrainer()"), ("❱ 167", "trainer.train(args)")])


@pytest.mark.parametrize("frames", [
    [_ENTRY, ("C:\\kohya_ss\\train_network.py", 213, "train",
              [(210, "vae_dtype = torch.float32 if args.no_half_vae else weight_dtype"), (211, ""), (212, "")])],
    [("/home/u/trainer/run_job.py", 88, "main", [(86, "config = load_config(path)"), (87, "items = prepare(config)")])],
    [_ENTRY, ("/srv/lab/my_tuner/core.py", 300, "fit", [(299, "self.setup_optimizers()")])],
    # the paste's end cuts the last row after a whole statement
    [_ENTRY, ("D:\\sd\\train_network.py", 250, "train", [(247, "vae.requires_grad_(False)")])],
])
def test_a_box_cut_in_the_jobs_own_code_is_start_up(frames):
    assert phase(box(*frames)) == "model_load"


@pytest.mark.parametrize("frames", [
    # only the entry's top-level code: the script ran, no more
    [_ENTRY],
    # the paste cut the only row shown, inside its statement
    [_ENTRY, ("C:\\kohya_ss\\train_network.py", 201, "train", [(198, "train_dataset_group.")])],
    # no row of the function's source shown
    [_ENTRY, ("C:\\kohya_ss\\train_network.py", 201, "train", [])],
    # the last frame is a library's or the launcher's, not the job's
    [_ENTRY, ("/venv/lib/python3.10/site-packages/somelib/util.py", 40, "helper", [(39, "x = y")])],
    [("C:\\venv\\lib\\site-packages\\accelerate\\commands\\launch.py", 918, "launch_command",
      [(917, "simple_launcher(args)")])],
])
def test_boxes_that_show_no_code_the_job_reached(frames):
    assert phase(box(*frames)) == "unknown"


def test_what_else_the_log_says_comes_first():
    job = box(_ENTRY, ("/home/u/trainer/run_job.py", 88, "main", [(87, "items = prepare(config)")]))
    assert phase(BAR + job) == "training"
    assert phase(CACHING + job) == "cache_latents"


@pytest.mark.parametrize("comment", [
    "# Predict the noise residual",
    "# Sample noise that we'll add to the latents",
    "# Add noise to the latents according to the noise magnitude at each timestep",
    "# Get the target for loss depending on the prediction type",
])
def test_the_training_steps_comments_among_a_boxs_rows(comment):
    frames = [_ENTRY, ("/workspace/kohya_ss/train_network.py", 775, "train", [(772, ""), (773, comment), (774, "")])]
    assert phase(box(*frames)) in ("first_step", "training")


def test_other_comments_are_not_the_step():
    frames = [_ENTRY, ("/workspace/kohya_ss/train_network.py", 442, "train", [(441, "# resume from the saved state")])]
    assert phase(box(*frames)) == "model_load"
