"""The memory model on the families beyond SD 1.5 / SDXL / FLUX.1: their token units, text
encoders, traced activation lines, and HunyuanImage-2.1's VRAM ladder from its guide."""

import pytest

from kohya_tuner.families import FAMILIES
from kohya_tuner.memory import estimate
from kohya_tuner.memory.setup import resolve

BASE = {"mixed_precision": "bf16", "gradient_checkpointing": True, "cache_latents": True,
        "cache_text_encoder_outputs": True, "network_train_unet_only": True, "network_dim": 16,
        "optimizer_type": "AdamW8bit", "sdpa": True}


@pytest.mark.parametrize("name,res,tokens", [
    ("sdxl", 1024, 128 * 128), ("sd2", 768, 96 * 96), ("flux", 1024, 64 * 64 + 512), ("chroma", 1024, 64 * 64 + 512),
    ("sd3", 1024, 64 * 64 + 77 + 256), ("sd35l", 1024, 64 * 64 + 77 + 256), ("lumina2", 1024, 64 * 64 + 256),
    ("hunyuan21", 2048, 64 * 64 + 256 + 128), ("anima", 1024, 64 * 64 + 512),
])
def test_token_units(name, res, tokens):
    assert resolve({**BASE, "resolution": str(res)}, FAMILIES[name]).latent_tokens == tokens


def test_text_length_arguments_count():
    s = resolve({**BASE, "t5xxl_max_token_length": 154}, FAMILIES["sd3"])
    assert s.latent_tokens == 64 * 64 + 77 + 154
    assert resolve({**BASE, "gemma2_max_token_length": 512}, FAMILIES["lumina2"]).latent_tokens == 64 * 64 + 512


@pytest.mark.parametrize("name", sorted(set(FAMILIES) - {"sd15"}))
def test_every_family_uses_its_own_sd_scripts_trace(name):
    e = estimate({**BASE, "resolution": str(FAMILIES[name].native_resolution)}, FAMILIES[name])
    assert not any("model classes" in a and "diffusers" in a for a in e.assumptions), e.assumptions
    assert not any("not traced yet" in a for a in e.assumptions), e.assumptions
    assert e.components_gib["activations"] > 0


def test_sd3_lora_trains_both_clips_and_t5_only_when_asked():
    cfg = {k: v for k, v in BASE.items() if k not in ("network_train_unet_only", "cache_text_encoder_outputs")}
    assert resolve(cfg, FAMILIES["sd35l"]).te_trained == (True, True, False)
    assert resolve({**cfg, "network_args": ["train_t5xxl=True"]}, FAMILIES["sd35l"]).te_trained == (True, True, True)
    assert resolve(cfg, FAMILIES["hunyuan21"]).te_trained == (False, False)  # lora_hunyuan_image wraps no TE


HY = {**BASE, "resolution": "2048", "split_attn": True}


def test_hunyuan_ladder_of_its_guide():
    """docs/hunyuan_image_train_network.md 6.1: 24 GB fp8_scaled + 9 swapped blocks, 12 GB 32, 8 GB 37
    (the 12 / 8 GB rows encode captions with fp8_vl / text_encoder_cpu, the guide's own options)."""
    fam = FAMILIES["hunyuan21"]
    assert estimate({**HY, "fp8_scaled": True, "blocks_to_swap": 9}, fam).fits(24)
    assert estimate({**HY, "fp8_scaled": True, "blocks_to_swap": 32, "fp8_vl": True}, fam).fits(12)
    assert estimate({**HY, "fp8_scaled": True, "blocks_to_swap": 37, "text_encoder_cpu": True}, fam).fits(8)
    # "--fp8_scaled is essential below 40 GB": without it 24 GB does not hold even with 9 swapped
    assert not estimate({**HY, "blocks_to_swap": 9}, fam).fits(24)
    # and the caching phase alone overflows 12 GB with the 15 GiB Qwen2.5-VL in bf16
    plain12 = estimate({**HY, "fp8_scaled": True, "blocks_to_swap": 32}, fam)
    assert not plain12.fits(12) and plain12.peak_phase == "cache_text_encoder"
    # more swapped blocks, less memory
    peaks = [estimate({**HY, "fp8_scaled": True, "blocks_to_swap": n, "text_encoder_cpu": True}, fam).peak_gib
             for n in (0, 9, 32, 37)]
    assert peaks == sorted(peaks, reverse=True)


def test_anima_takes_no_fp8():
    fam = FAMILIES["anima"]
    plain = estimate({**BASE, "resolution": "1024"}, fam)
    asked = estimate({**BASE, "resolution": "1024", "fp8_base": True}, fam)
    assert asked.peak_gib == pytest.approx(plain.peak_gib)
    assert any("fp8_base" in a for a in asked.assumptions)
