"""Classes behind batch 19's first-read misses: a traceback cut in a training script's import chain is
start-up; diffusers' save calls are saving; the web UI taking a generated image is sampling; fetching
the next batch from a data iterator is the step; PyTorch Lightning's validation loops are sampling.
Several forms of each, and text that must not be read as them."""
from __future__ import annotations

import pytest

from tests.logparse_texts import CACHING, HEAD, OOM, frame, phase

_ERR = "AttributeError: 'NoneType' object has no attribute 'x'\n"


# ---- a traceback cut inside a training script's imports ---------------------------------------------

@pytest.mark.parametrize("tail", [
    frame("/ot/modules/trainer/GenericTrainer.py", 20, "<module>", "from modules.dataLoader import Loader"),
    '  File "/ot/modules/trainer/Generi',  # the paste stops inside the last frame line
    "",
])
def test_a_traceback_cut_in_a_training_scripts_import_chain_is_start_up(tail):
    text = (HEAD + frame("/ot/scripts/train_ui.py", 6, "<module>", "from modules.ui.TrainUI import TrainUI")
            + frame("/ot/modules/ui/TrainUI.py", 11, "<module>", "from modules.trainer.GenericTrainer import G")
            + tail)
    assert phase(CACHING + text) == "model_load"


@pytest.mark.parametrize("text", [
    # Only the script's first frame: every traceback of the script starts there.
    HEAD + frame("/sd/train_network.py", 40, "<module>"),
    HEAD + frame("/sd/train_network.py", 40, "<module>", "trainer.train(args)"),
    # An import chain, then the code it runs: not top-level any more.
    HEAD + frame("/sd/train_network.py", 6, "<module>", "import library.util") + frame("/sd/library/util.py", 90, "load"),
])
def test_a_cut_traceback_that_shows_no_import_chain_is_no_start_up(text):
    assert phase(text) == "unknown"


# ---- diffusers' save calls ---------------------------------------------------------------------------------

@pytest.mark.parametrize("frames", [
    frame("/x/train_text_to_image_lora.py", 900, "main", "unet.save_attn_procs(args.output_dir)"),
    frame("/x/train_dreambooth_lora.py", 1300, "main", "LoraLoaderMixin.save_lora_weights(args.output_dir, unet_lora_layers=u)"),
    frame("/x/train_dreambooth.py", 1200, "main", "pipeline.save_pretrained(args.output_dir)"),
    frame("/venv/lib/diffusers/loaders.py", 300, "save_attn_procs"),
])
def test_diffusers_save_calls_are_saving(frames):
    assert phase(HEAD + frames + _ERR) == "saving"


def test_loading_from_pretrained_is_not_saving():
    assert phase(HEAD + frame("/x/train.py", 10, "main", "unet = UNet2DConditionModel.from_pretrained(p)") + _ERR) \
        == "model_load"


# ---- the web UI taking a generated image -----------------------------------------------------------------------

def test_the_web_ui_taking_a_generated_image_is_sampling():
    text = (HEAD + frame("/webui/modules/textual_inversion/textual_inversion.py", 600, "train_embedding",
                         "shared.state.assign_current_image(image)")
            + frame("/webui/modules/shared_state.py", 150, "assign_current_image") + _ERR)
    assert phase(text) == "sampling"


# ---- fetching the next batch ------------------------------------------------------------------------------------

@pytest.mark.parametrize("source", [
    "batch = next(dataloader_iter)",
    "batch = next(train_dataloader_iter)",
    "x = next(data_iter)",
    "iterator = get_data_iterator_for_step(train_dataloader, model_engine)",
])
def test_fetching_the_next_batch_is_the_step(source):
    assert phase(CACHING + HEAD + frame("/dp/train.py", 300, "<module>", source) + _ERR) in ("first_step", "training")


@pytest.mark.parametrize("source", ["prompt = next(iter(prompts))", "name = next(names)"])
def test_next_of_other_iterators_is_not_a_batch(source):
    assert phase(HEAD + frame("/x/run.py", 30, "main", source) + _ERR) == "unknown"


# ---- PyTorch Lightning's validation loops --------------------------------------------------------------------

@pytest.mark.parametrize("bar", [
    "Sanity Checking DataLoader 0:   0%|          | 0/2 [00:00<?, ?it/s]",
    "Validation DataLoader 0:  50%|█████     | 1/2 [00:01<00:01,  1.00it/s]",
])
def test_lightnings_validation_loops_are_sampling(bar):
    assert phase("Loading model from m.ckpt\n" + bar + "\n" + OOM) == "sampling"


def test_lightnings_training_bar_is_not_validation():
    bar = "Epoch 0:  10%|█         | 10/100 [00:10<01:30,  1.00it/s, loss=0.1]"
    assert phase("Loading model from m.ckpt\n" + bar + "\n" + OOM) in ("first_step", "training")
