"""Classes behind batch 23's first-read misses: a caching script's name with a model's prefix
(`wan_cache_latents.py`) in either frame format, and a script writing its sample images from an
`inference_samples` function. Several forms of each, and frames that must not be read as them."""
from __future__ import annotations

import pytest

from tests.logparse_texts import HEAD, OOM, frame, phase


@pytest.mark.parametrize("row, expected", [
    (frame("/m/src/musubi_tuner/wan_cache_latents.py", 239, "main"), "cache_latents"),
    ("│ /m/src/musubi_tuner/wan_cache_latents.py:239 in main                              │\n", "cache_latents"),
    (frame("/m/qwen_image_cache_text_encoder_outputs.py", 80, "main"), "cache_text_encoder"),
    ("│ /m/hv_cache_text_encoder_outputs.py:80 in main                                    │\n", "cache_text_encoder"),
])
def test_a_caching_script_with_a_models_prefix_is_its_caching_pass(row, expected):
    text = (HEAD + row + OOM) if row.startswith("  File") else (
        "╭─────────────────── Traceback (most recent call last) ───────────────────╮\n" + row
        + "╰──────────────────────────────────────────────────────────────────────────╯\n" + OOM)
    assert phase(text) == expected


def test_a_module_that_only_mentions_a_cache_is_not_a_caching_script():
    # A library's latent cache module is the cache, not the script: its frames at level 1 say
    # nothing by the script-name rule (they may by others).
    assert phase(HEAD + frame("/m/latent_cache_utils.py", 10, "get") + OOM) != "cache_latents"


@pytest.mark.parametrize("frames", [
    frame("/x/train_dreambooth.py", 900, "<module>", "inference_samples(args, pipeline)")
    + frame("/x/train_dreambooth.py", 300, "inference_samples", "image.save(path)"),
    frame("/x/train.py", 400, "main", "images = inference_sample(pipe, prompt)"),
])
def test_a_scripts_inference_samples_are_sampling(frames):
    assert phase(HEAD + frames + "OSError: cannot write mode RGBA as JPEG\n") == "sampling"


def test_inference_without_samples_is_not_sampling_by_name():
    assert phase(HEAD + frame("/x/serve.py", 10, "inference", "out = model(x)") + "ValueError: bad\n") != "sampling"
