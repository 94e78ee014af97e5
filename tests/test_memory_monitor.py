"""The three figures of a peak: allocated (tensors), reserved (plus the allocator's free blocks) and what a
GPU monitor shows (plus the CUDA context, by module-loading mode, data/cuda_runtime.toml)."""

import pytest

from kohya_tuner.families import FAMILIES
from kohya_tuner.memory import estimate
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
    # the fit's figure is what the card must hold: the same as a monitor's with lazy loading
    assert e.monitor_gib == pytest.approx(e.peak_gib)
    js = e.to_json()
    assert js["allocated_gib"] == round(e.allocated_gib, 3) and js["monitor_gib"] == round(e.monitor_gib, 3)


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
