"""sd-scripts' OFT networks: kohya-tuner's count against the modules' own counts on the real layers
(data/oft_targets.json, tools/memtrace/oft_targets.py), and the estimator using it instead of a LoRA
of rank network_dim."""

import pytest

from kohya_tuner.families import FAMILIES
from kohya_tuner.memory import estimate
from kohya_tuner.memory import oft as O

DATA = O.targets()
CASES = [(arch, mode, dim) for arch, ent in DATA["archs"].items() for mode, refs in ent["reference"].items()
         for dim in refs]


@pytest.mark.parametrize("arch,mode,dim", CASES)
def test_count_matches_the_modules_own(arch, mode, dim):
    ent = DATA["archs"][arch]
    want = ent["reference"][mode][dim]
    total, refused = 0, False
    for _a, b, _k, n, splits in ent["modes"][mode]:
        try:
            total += O.layer_params(b, splits, int(dim)) * n
        except O.Refused:
            refused = True
    if isinstance(want, str):  # the module itself refused this dim
        assert refused, (arch, mode, dim, want)
    else:
        assert not refused and total == want, (arch, mode, dim)


def _cfg(module, dim, **args):
    return {"mixed_precision": "bf16", "network_module": module, "network_dim": dim, "network_alpha": 1e-3,
            "network_args": [f"{k}={v}" for k, v in args.items()], "gradient_checkpointing": True, "sdpa": True,
            "cache_latents": True}


def test_flux_oft_is_not_a_lora_of_rank_dim():
    fam = FAMILIES["flux"]
    cfg = _cfg("networks.oft_flux", 128) | {"network_train_unet_only": True, "cache_text_encoder_outputs": True,
                                           "fp8_base": True}
    e = estimate(cfg, fam)
    assert e.lora_params == DATA["archs"]["flux"]["reference"]["attn"]["128"]
    lora = estimate(cfg | {"network_module": "networks.lora_flux"}, fam)
    assert e.lora_params * 20 < lora.lora_params and e.peak_gib < lora.peak_gib
    assert not any("counted as a LoRA" in a for a in e.assumptions)


def test_modes_and_the_bool_of_a_string():
    fam = FAMILIES["sdxl"]
    attn = estimate(_cfg("networks.oft", 8), fam)
    lin = estimate(_cfg("networks.oft", 8, enable_all_linear="True"), fam)
    said_false = estimate(_cfg("networks.oft", 8, enable_all_linear="False"), fam)
    assert attn.lora_params < lin.lora_params == said_false.lora_params
    assert any("enable_all_linear=False" in a for a in said_false.assumptions)
    conv = estimate(_cfg("networks.oft", 8, enable_conv="True"), fam)
    assert conv.lora_params == DATA["archs"]["sdxl"]["reference"]["conv"]["8"]


def test_text_encoders_are_never_trained_by_oft():
    e = estimate(_cfg("networks.oft", 8), FAMILIES["sd15"])
    assert e.settings["text_encoders_trained"] == []
    assert any("wraps only the denoiser" in a for a in e.assumptions)


def test_flux_dim_that_does_not_divide_is_said():
    e = estimate(_cfg("networks.oft_flux", 5) | {"network_train_unet_only": True}, FAMILIES["flux"])
    assert any("stops when it builds" in a for a in e.assumptions)


def test_traced_oft_activations_are_used_where_traced():
    from kohya_tuner.memory.data import coefficients

    lines = [ln for ln in coefficients()["network_activations"]["lines"] if ln["network"] == "networks.oft"]
    assert lines, "networks.oft traced for at least one family"
    for ln in lines:
        fam = FAMILIES[ln["arch"]]
        cfg = _cfg("networks.oft", 8) | {"gradient_checkpointing": ln["ckpt"], "network_train_unet_only": True}
        e = estimate(cfg, fam)
        lora = estimate(cfg | {"network_module": "networks.lora", "network_args": []}, fam)
        x = e.settings["tokens"] * e.settings["batch"]
        extra = max(ln["mib_per_token"] * x / 1024 + ln["intercept_gib"], min([0.0] + [y for _x, y in ln["points"]]))
        want = max(lora.components_gib["activations"] + extra, 0)
        assert e.components_gib["activations"] == pytest.approx(want, abs=1e-3)
        assert not any("its activations are not traced" in a for a in e.assumptions)


def test_flux_oft_activations_untraced_is_said():
    e = estimate(_cfg("networks.oft_flux", 64) | {"network_train_unet_only": True}, FAMILIES["flux"])
    assert any("its activations are not traced" in a for a in e.assumptions)
