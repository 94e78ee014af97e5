"""Two more classes behind batch 105's misses: a launch script traced by the shell (`set -x`), and PyTorch
Lightning's spawning launcher starting its workers. Several forms of each, and text that must not be read so."""
from __future__ import annotations

import pytest

from tests.logparse_texts import HEAD, frame, phase

LIGHTNING = "/env/lib/python3.10/site-packages/pytorch_lightning"


@pytest.mark.parametrize("lines", [
    ["+ export WANDB_MODE=online", "+ WANDB_MODE=online", "+ export NCCL_P2P_DISABLE=1"],
    ["++ GPU_IDS=0,1,2,3"],
    ["+ accelerate launch --config_file accelerate_configs/uncompiled_2.yaml train.py"],
    ["+ torchrun --nproc_per_node=8 train.py --config cfg.yaml"],
])
def test_a_traced_launch_script_is_start_up(lines):
    assert phase("\n".join(lines) + "\n") == "model_load"


@pytest.mark.parametrize("line", [
    "+ python scripts/train_ui.py",
    "+ 1 more",
    "+ added the new dataset",
    "+export X=1",
])
def test_other_lines_with_a_plus_say_no_stage(line):
    assert phase(line + "\n") == "unknown"


@pytest.mark.parametrize("launcher, source", [
    ("strategies/launchers/spawn.py", "mp.spawn("),
    ("strategies/launchers/multiprocessing.py", "process_context = mp.start_processes("),
])
def test_lightnings_spawning_launcher_is_start_up(launcher, source):
    text = (HEAD + frame("/w/finetune.py", 103, "finetune", "trainers.fit(model, datamodule=data)")
            + frame(f"{LIGHTNING}/trainer/trainer.py", 608, "fit", "call._call_and_handle_interrupt(")
            + frame(f"{LIGHTNING}/trainer/call.py", 41, "_call_and_handle_interrupt",
                    "return trainer.strategy.launcher.launch(trainer_fn, *args, trainer=trainer, **kwargs)")
            + frame(f"{LIGHTNING}/{launcher}", 78, "launch", source)
            + "torch.multiprocessing.spawn.ProcessRaisedException: boom\n")
    assert phase(text) == "model_load"


def test_the_subprocess_launcher_runs_the_fit_itself():
    text = (HEAD + frame("/w/train.py", 585, "train", "trainer.fit(model, dataloader)")
            + frame(f"{LIGHTNING}/strategies/launchers/subprocess_script.py", 105, "launch",
                    "return function(*args, **kwargs)")
            + frame("/w/model.py", 80, "training_step", "loss = self.compute_loss(batch)")
            + "RuntimeError: boom\n")
    assert phase(text) in ("first_step", "training")


def test_a_workers_step_frames_outrank_the_spawning_launcher():
    text = (HEAD + frame(f"{LIGHTNING}/strategies/launchers/spawn.py", 78, "launch", "mp.spawn(")
            + frame("/w/model.py", 80, "training_step", "loss = self.compute_loss(batch)")
            + "RuntimeError: boom\n")
    assert phase(text) in ("first_step", "training")
