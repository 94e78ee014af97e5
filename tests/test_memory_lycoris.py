"""LyCORIS parameter counts: kohya-tuner's per-algorithm formulas against the counts LyCORIS
itself gave for the same layers (data/lycoris_targets.json, tools/memtrace/lycoris_targets.py),
and the estimator using them instead of a LoRA stand-in."""

import pytest

from kohya_tuner.families import FAMILIES
from kohya_tuner.memory import estimate
from kohya_tuner.memory import lycoris as L

DATA = L.targets()
CASES = [(arch, algo) for arch, ent in DATA["archs"].items() for algo in ent["reference"]]


@pytest.mark.parametrize("arch,algo", CASES)
def test_formulas_match_lycoris_own_counts(arch, algo):
    ent = DATA["archs"][arch]
    r = ent["reference"][algo].get("rank", DATA["reference_rank"])
    o = L.Options(algo, r, r)
    for part in ("unet", "text_encoder"):
        ours = sum(L.layer_params(a, b, k, o) * n for a, b, k, n, _kind in ent[part])
        assert ours == ent["reference"][algo][part], (arch, algo, part)


@pytest.mark.parametrize("dim,factor,want", [
    (127, -1, (1, 127)), (128, -1, (8, 16)), (250, -1, (10, 25)), (360, -1, (18, 20)), (1024, -1, (32, 32)),
    (128, 2, (2, 64)), (250, 4, (2, 125)), (360, 8, (8, 45)), (512, 16, (16, 32)), (1024, 8, (8, 128)),
])
def test_lokr_factorization(dim, factor, want):
    assert L.factorization(dim, factor) == want


def _cfg(algo, **extra):
    args = [f"algo={algo}", "conv_dim=8"] + [f"{k}={v}" for k, v in extra.items()]
    return {"mixed_precision": "bf16", "network_module": "lycoris.kohya", "network_dim": 8, "network_args": args,
            "network_train_unet_only": True, "gradient_checkpointing": True, "sdpa": True}


def test_estimate_counts_each_algorithm():
    fam = FAMILIES["sdxl"]
    counts = {a: estimate(_cfg(a), fam).lora_params for a in ("locon", "loha", "lokr", "ia3", "full")}
    ref = DATA["archs"]["sdxl"]["reference"]
    assert counts["locon"] == ref["locon"]["unet"]
    assert counts["loha"] == 2 * counts["locon"]
    assert counts["ia3"] == ref["ia3"]["unet"] < counts["lokr"] < counts["locon"]
    # native fine-tuning of every wrapped layer: more than the LoRA, less than the whole U-Net
    assert counts["locon"] < counts["full"] < fam.diffusion.params
    e = estimate(_cfg("loha"), fam)
    assert not any("counted as a LoRA" in a for a in e.assumptions)


def test_text_encoder_layers_count_when_trained():
    cfg = _cfg("locon")
    cfg.pop("network_train_unet_only")
    with_te = estimate(cfg, FAMILIES["sd15"]).lora_params
    ref = DATA["archs"]["sd15"]["reference"]["locon"]
    assert with_te == ref["unet"] + ref["text_encoder"]


def test_lokr_options_change_the_count():
    fam = FAMILIES["sd15"]
    base = estimate(_cfg("lokr"), fam).lora_params
    assert estimate(_cfg("lokr", factor=4), fam).lora_params != base
    assert estimate(_cfg("lokr", full_matrix="True"), fam).lora_params > base


def test_unknown_algorithm_is_said():
    e = estimate(_cfg("tlora"), FAMILIES["sd15"])
    assert any("tlora" in a and "not modelled" in a for a in e.assumptions)


def test_every_algorithm_has_a_reference_from_lycoris():
    # The formulas are checked above only where LyCORIS itself counted: every modelled algorithm but
    # "full" (meta tensors have no weights to copy) must have been counted on SD 1.5 and SDXL.
    for arch in ("sd15", "sdxl"):
        assert set(DATA["archs"][arch]["reference"]) == set(L.ALGOS) - {"lora", "full"}


@pytest.mark.parametrize("dim,factor,want", [
    (320, 16, (10, 32)), (768, 8, (6, 128)), (1280, 16, (10, 128)), (3072, 8, (6, 512)),
    (18432, 16, (0, 0)), (18432, 32, (18, 1024)), (320, 8, (0, 0)),
])
def test_butterfly_factors(dim, factor, want):
    assert L.butterfly(dim, factor) == want


def test_oft_rotations_are_smaller_than_locon_and_grow_with_rank():
    fam = FAMILIES["sdxl"]
    diag = {r: estimate(_cfg("diag-oft") | {"network_dim": r}, fam).lora_params for r in (4, 16)}
    assert diag[4] < diag[16] < estimate(_cfg("locon"), fam).lora_params
    # rescaled adds one scale per wrapped output feature
    assert estimate(_cfg("diag-oft", rescaled="True"), fam).lora_params > estimate(_cfg("diag-oft"), fam).lora_params


def test_boft_refusal_is_said():
    # FLUX's modulation width 18432 = 18 x 1024 needs a BOFT block of 18 (21504 one of 42): rank 16 cannot build them.
    cfg = _cfg("boft") | {"network_dim": 16}
    e = estimate(cfg, FAMILIES["flux"])
    assert any("18432" in a and "stops" in a for a in e.assumptions)
    ok = estimate(cfg | {"network_dim": 64}, FAMILIES["flux"])
    assert not any("stops" in a for a in ok.assumptions) and ok.lora_params > e.lora_params


def _lines():
    from kohya_tuner.memory.data import coefficients
    return coefficients()["network_activations"]["lines"]


def test_traced_network_activations_are_added_to_the_loras():
    # Each traced module adds what it saved beyond the family's LoRA at the same size (network_traces.py).
    fam = FAMILIES["sd15"]
    base_cfg = _cfg("locon") | {"network_module": "networks.lora", "network_args": [], "cache_latents": True}
    base = estimate(base_cfg, fam).components_gib["activations"]
    lines = [ln for ln in _lines() if ln["arch"] == "sd15" and ln["ckpt"] and ln["network"] == "lycoris.kohya"]
    assert lines
    for ln in lines:
        e = estimate(_cfg(ln["algo"]) | {"cache_latents": True}, fam)
        x = e.settings["tokens"] * e.settings["batch"]
        extra = max(ln["mib_per_token"] * x / 1024 + ln["intercept_gib"], min([0.0] + [y for _x, y in ln["points"]]))
        want = max(base + extra, 0.0)
        assert e.components_gib["activations"] == pytest.approx(want, abs=1e-3), ln["algo"]
        assert not any("its activations are not traced" in a for a in e.assumptions)


def test_loha_rebuilds_more_than_locon_keeps():
    # LoHa rebuilds each wrapped weight's delta every step; LoCon keeps only low-rank activations.
    for arch in ("sd15", "sdxl"):
        by = {ln["algo"]: ln["points"][0][1] for ln in _lines() if ln["arch"] == arch and ln["ckpt"]
              and ln["network"] == "lycoris.kohya"}
        assert by["loha"] > by["locon"], arch


def test_untraced_family_is_said():
    e = estimate(_cfg("loha"), FAMILIES["flux"])
    assert any("its activations are not traced" in a for a in e.assumptions)
