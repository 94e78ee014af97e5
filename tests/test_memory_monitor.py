"""The three figures of a peak: allocated (tensors), reserved (plus the allocator's free blocks) and what a
GPU monitor shows (plus the CUDA context, by module-loading mode, data/cuda_runtime.toml)."""

import pytest

from kohya_tuner.families import FAMILIES
from kohya_tuner.memory import budget_gib, estimate
from kohya_tuner.memory import monitor as M

CFG = {"mixed_precision": "bf16", "network_module": "networks.lora", "network_dim": 16, "sdpa": True,
       "gradient_checkpointing": True, "cache_latents": True, "resolution": "1024,1024",
       "network_train_unet_only": True}


def test_figures_order_and_parts():
    e = estimate(CFG, FAMILIES["sdxl"])
    parts = e.components_gib
    assert e.allocated_gib < e.reserved_gib < e.monitor_gib
    assert e.reserved_gib - e.allocated_gib == pytest.approx(parts["fragmentation"])
    assert e.monitor_gib - e.reserved_gib == pytest.approx(M.context_gib())
    # the peak the fit decides on is what the allocator holds (allocated + its fragmentation); the parts
    # sum to it, and the CUDA context is no part of it: the budget leaves it out of the card instead
    assert e.peak_gib == pytest.approx(e.reserved_gib) and "cuda_context" not in parts
    assert sum(parts.values()) == pytest.approx(e.peak_gib)
    js = e.to_json()
    assert js["allocated_gib"] == round(e.allocated_gib, 3) and js["monitor_gib"] == round(e.monitor_gib, 3)
    assert js["peak_gib"] == round(e.reserved_gib, 3) < js["monitor_gib"]


def test_the_budget_leaves_the_context_out_so_fits_is_the_same_rule_as_before():
    # a run fits when what the allocator holds fits the card less the context: with lazy loading the
    # verdict is the one "monitor figure within the card's budget" gives
    e = estimate(CFG, FAMILIES["sdxl"])
    for gb in (6, 8, 10, 12, 16):
        assert e.fits(gb) == (e.monitor_gib <= budget_gib(gb) + M.context_gib())
    assert budget_gib(12) - budget_gib(12, driver="470.82") == pytest.approx(
        M.context_gib("470.82") - M.context_gib())


def test_the_driver_sizes_the_context_of_the_monitor_figure_and_the_budget():
    lazy, eager = estimate(CFG, FAMILIES["sdxl"], driver="550.54.14"), estimate(CFG, FAMILIES["sdxl"], driver="470.82")
    assert lazy.peak_gib == eager.peak_gib and lazy.allocated_gib == eager.allocated_gib
    assert eager.monitor_gib - lazy.monitor_gib == pytest.approx(M.context_gib("470.82") - M.context_gib("550.54.14"))
    assert eager.driver == "470.82"
    # the same peak fits a smaller budget under an old driver's eager context: find a card where it tips
    tipped = [gb for gb in range(6, 49) if lazy.fits(gb) != eager.fits(gb)]
    assert all(lazy.fits(gb) and not eager.fits(gb) for gb in tipped)


def test_the_detected_driver_reaches_the_estimate_from_the_cli(monkeypatch, tmp_path):
    import json

    from kohya_tuner import gpu
    from tests.clihelp import invoke

    def fake_detect(index=0, driver="470.82"):
        return gpu.GpuInfo(index=0, name="Old card", total_gib=11.76, free_gib=11.5, used_gib=0.26,
                           compute_capability=(8, 6), driver=driver, processes=())

    monkeypatch.setattr(gpu, "detect", fake_detect)
    cfg = tmp_path / "c.toml"
    cfg.write_text('network_module = "networks.lora"\nmixed_precision = "bf16"\nnetwork_dim = 16\n'
                   'sdpa = true\ngradient_checkpointing = true\ncache_latents = true\n'
                   'resolution = "1024,1024"\nnetwork_train_unet_only = true\n'
                   'pretrained_model_name_or_path = "sdxl.safetensors"\n')
    r = invoke("estimate", str(cfg), "--model", "sdxl", "--gpu", "auto", "--no-history", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["monitor_gib"] - out["reserved_gib"] == pytest.approx(M.context_gib("470.82"), abs=2e-3)
    assert out["gpu"]["budget_gib"] == pytest.approx(budget_gib(12, driver="470.82"), abs=2e-3)
    text = invoke("estimate", str(cfg), "--model", "sdxl", "--gpu", "auto", "--no-history")
    assert "eager module loading, driver 470.82" in " ".join(text.stdout.split())


@pytest.mark.parametrize("driver,mode", [("550.54.14", "lazy"), ("515.43.04", "lazy"), ("470.199.02", "eager"),
                                         (None, "lazy"), ("garbage", "lazy")])
def test_loading_mode_by_driver(driver, mode):
    assert M.loading_mode(driver) == mode


def test_an_eager_driver_shows_more_than_the_fit_assumed():
    parts = {"weights": 5.0, "activations": 1.0, "fragmentation": 0.1, "cuda_context": M.context_gib()}
    lazy, eager = M.figures(parts), M.figures(parts, driver="470.82")
    assert lazy["allocated_gib"] == eager["allocated_gib"] == pytest.approx(6.0)
    assert eager["monitor_gib"] - lazy["monitor_gib"] == pytest.approx(
        M.runtime()["context"]["eager"]["gib"] - M.runtime()["context"]["lazy"]["gib"])


def test_every_context_figure_has_a_source():
    for mode in ("lazy", "eager"):
        ent = M.runtime()["context"][mode]
        assert ent["sources"] and all(s.startswith("https://") and " : " in s for s in ent["sources"])


def test_history_correction_scales_all_three():
    parts = {"weights": 5.0, "fragmentation": 0.5, "cuda_context": 0.4, "history_correction": 0.59}
    f = M.figures(parts, correction=1.1)
    assert f["allocated_gib"] == pytest.approx(5.5) and f["monitor_gib"] == pytest.approx(1.1 * (5.5 + M.context_gib()))
