"""Classes behind batch 24's first-read misses: sd-scripts building its dataset from the config's
blueprint and a model's attention set up for xformers are start-up; a script's bare "training..."
line begins its training loop. Several forms of each, and text that must not be read as them."""
from __future__ import annotations

import pytest

from tests.logparse_texts import BAR, CACHING, HEAD, OOM, frame, phase

_ERR = "ValueError: something broke\n"


@pytest.mark.parametrize("frames", [
    frame("/sd/train_network.py", 525, "train",
          "train_dataset_group = config_util.generate_dataset_group_by_blueprint(blueprint.dataset_group)")
    + frame("/sd/library/config_util.py", 500, "generate_dataset_group_by_blueprint", "dataset = dataset_klass(**asdict(d))"),
    frame("/sd/train_network.py", 510, "train", "blueprint = blueprint_generator.generate(user_config, args)"),
    frame("/x/train_dreambooth.py", 553, "main", "vae.enable_xformers_memory_efficient_attention()"),
    frame("/venv/lib/diffusers/models/modeling_utils.py", 250, "set_use_memory_efficient_attention_xformers"),
])
def test_building_the_dataset_and_setting_attention_up_are_start_up(frames):
    assert phase(CACHING + HEAD + frames + _ERR) == "model_load"


def test_xformers_attention_running_in_a_step_is_not_its_set_up():
    text = (BAR + HEAD + frame("/sd/train_network.py", 900, "train", "noise_pred = self.call_unet(args, unet)")
            + frame("/venv/lib/xformers/ops/fmha/__init__.py", 200, "memory_efficient_attention") + OOM)
    assert phase(text) == "training"


@pytest.mark.parametrize("line", ["training...", "Training ...", "training…"])
def test_a_bare_training_line_is_the_training_header(line):
    # Start-up's end until the loop shows (the convention's training-header clause); its bar is the loop's.
    assert phase(CACHING + line + "\nKilled\n") == "model_load"
    assert phase(CACHING + line + "\nsteps:   0%|          | 0/10 [00:00<?, ?it/s]\nKilled\n") == "first_step"


@pytest.mark.parametrize("line", ["training finished", "training config saved...", "training data: 24 images"])
def test_other_lines_starting_with_training_do_not(line):
    assert phase(CACHING + line + "\n" + OOM) not in ("first_step", "training")
