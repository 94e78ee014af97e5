"""Optimizer state table lookups and the per-GPU measured-peak history."""

from __future__ import annotations

import json

import pytest

from kohya_tuner import history
from kohya_tuner.families import FAMILIES
from kohya_tuner.memory import estimate
from kohya_tuner.optimizers import OPTIMIZERS, lookup, state_bytes_per_param

FLUX = FAMILIES["flux"]
CFG = dict(mixed_precision="bf16", fp8_base=True, gradient_checkpointing=True, cache_latents=True,
           cache_text_encoder_outputs=True, network_train_unet_only=True, network_dim=16, resolution="1024",
           network_module="networks.lora_flux")


# ---- optimizers ---------------------------------------------------------------------------


@pytest.mark.parametrize("written,name", [
    ("adamw8bit", "AdamW8bit"), ("ADAMW8BIT", "AdamW8bit"), ("PagedAdamW8bit", "PagedAdamW8bit"),
    ("bitsandbytes.optim.AdEMAMix8bit", "AdEMAMix8bit"), ("prodigyopt.Prodigy", "Prodigy"),
    ("adafactor", "Adafactor"), ("transformers.optimization.Adafactor", "Adafactor"),
    ("DAdaptAdam", "DAdaptAdam"), ("AdamWScheduleFree", "AdamWScheduleFree"), ("lion_pytorch.Lion", "Lion"),
    ("", "AdamW"), (None, "AdamW"),
])
def test_lookup_is_case_insensitive_and_takes_class_paths(written, name):
    r = lookup(written)
    assert r.spec.name == name and r.known


def test_legacy_flags_stand_in_for_optimizer_type():
    assert lookup("", use_8bit_adam=True).spec.name == "AdamW8bit"
    assert lookup(None, use_lion_optimizer=True).spec.name == "Lion"


def test_unknown_optimizer_is_adamw_and_flagged():
    r = lookup("somelib.Mystery")
    assert r.spec.name == "AdamW" and not r.known and r.written == "somelib.Mystery"


def test_state_bytes_per_param_table():
    fp32 = 4.0
    assert state_bytes_per_param(lookup("AdamW"), fp32, 16) == 8
    assert state_bytes_per_param(lookup("AdamW"), 2.0, 16) == 4  # full_bf16: states in the param dtype
    assert state_bytes_per_param(lookup("AdamW8bit"), fp32, 16) == pytest.approx(2.03, abs=0.01)
    assert state_bytes_per_param(lookup("AdamW8bit"), 2.0, 16) == state_bytes_per_param(lookup("AdamW8bit"), 4.0, 16)
    assert state_bytes_per_param(lookup("Lion"), fp32, 16) == 4
    assert state_bytes_per_param(lookup("Lion8bit"), fp32, 16) == pytest.approx(1.0, abs=0.02)
    assert state_bytes_per_param(lookup("SGDNesterov"), fp32, 16) == 4
    assert state_bytes_per_param(lookup("Prodigy"), fp32, 16) == 16
    assert state_bytes_per_param(lookup("SGDScheduleFree"), fp32, 16) == 4
    # Factored: about 4/rank bytes per parameter, so it shrinks as the rank grows.
    r4 = state_bytes_per_param(lookup("Adafactor"), fp32, 4)
    r64 = state_bytes_per_param(lookup("Adafactor"), fp32, 64)
    assert r4 == pytest.approx(1.0, rel=0.01) and r64 < r4 / 10
    assert state_bytes_per_param(lookup("Adafactor", ["beta1=0.9"]), fp32, 16) > 4
    assert state_bytes_per_param(lookup("SGD", ["momentum=0.9"]), fp32, 16) == 4


def test_every_table_entry_has_a_note():
    for key, spec in OPTIMIZERS.items():
        assert spec.note, key
        assert key == key.lower()


# ---- history ----------------------------------------------------------------------------


def entry(gpu="NVIDIA GeForce RTX 3060", model="flux", predicted=10.0, measured=11.0, fp=""):
    return history.HistoryEntry(time=1.0, gpu_name=gpu, gpu_total_gib=12.0, model=model, fingerprint=fp,
                                predicted_gib=predicted, measured_peak_gib=measured)


def test_append_and_load_round_trip_in_user_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KOHYA_TUNER_HOME", str(tmp_path))
    history.append(entry())
    history.append({"gpu_name": "X", "model": "sdxl", "predicted_gib": 5.0, "measured_peak_gib": 4.5})
    loaded = history.load()
    assert [e.model for e in loaded] == ["flux", "sdxl"]
    assert (tmp_path / "history.jsonl").is_file()
    assert loaded[1].time > 0


def test_damaged_lines_are_skipped(tmp_path):
    p = tmp_path / "h.jsonl"
    p.write_text(json.dumps(entry().model_dump()) + "\n{not json\n\n" + json.dumps({"model": "x"}) + "\n")
    assert len(history.load(p)) == 1
    assert history.load(tmp_path / "missing.jsonl") == []


def test_correction_is_median_ratio_on_same_gpu_and_model():
    entries = [entry(measured=11.0), entry(measured=12.0), entry(measured=10.5), entry(gpu="Other", measured=20.0),
               entry(model="sdxl", measured=30.0)]
    factor, n = history.correction(entries, "nvidia geforce rtx 3060", "flux")
    assert n == 3 and factor == pytest.approx(1.1)


def test_correction_prefers_runs_with_the_same_settings():
    entries = [entry(measured=11.0, fp="a"), entry(measured=13.0, fp="b"), entry(measured=13.0, fp="b")]
    assert history.correction(entries, "NVIDIA GeForce RTX 3060", "flux", fingerprint="b") == (pytest.approx(1.3), 2)
    assert history.correction(entries, "NVIDIA GeForce RTX 3060", "flux", fingerprint="zzz")[1] == 3


def test_one_low_run_does_not_shrink_the_estimate_but_two_do():
    assert history.correction([entry(measured=9.0)], "NVIDIA GeForce RTX 3060", "flux") == (1.0, 0)
    factor, n = history.correction([entry(measured=9.0), entry(measured=9.2)], "NVIDIA GeForce RTX 3060", "flux")
    assert n == 2 and factor == pytest.approx(0.91)


def test_correction_is_clipped_and_needs_a_gpu():
    assert history.correction([entry(measured=50.0)], "NVIDIA GeForce RTX 3060", "flux")[0] == history.MAX_FACTOR
    assert history.correction([entry()], None, "flux") == (1.0, 0)
    assert history.correction([], "NVIDIA GeForce RTX 3060", "flux") == (1.0, 0)


def test_estimate_applies_history_and_says_so():
    plain = estimate(CFG, FLUX)
    hist = [entry(predicted=10.0, measured=11.0)]
    corrected = estimate(CFG, FLUX, history=hist, gpu_name="NVIDIA GeForce RTX 3060")
    assert corrected.peak_gib == pytest.approx(plain.peak_gib * 1.1)
    assert corrected.correction == pytest.approx(1.1)
    assert corrected.uncorrected_peak_gib == pytest.approx(plain.peak_gib)
    assert any(a.startswith("scaled by 1.100") for a in corrected.assumptions)
    assert sum(corrected.components_gib.values()) == pytest.approx(corrected.peak_gib)
    other = estimate(CFG, FLUX, history=hist, gpu_name="Another GPU")
    assert other.peak_gib == pytest.approx(plain.peak_gib)


def test_fingerprint_tracks_memory_settings_only():
    a = history.fingerprint(CFG, FLUX)
    assert a == history.fingerprint(dict(CFG, learning_rate=1e-3, output_name="x"), FLUX)
    assert a != history.fingerprint(dict(CFG, network_dim=32), FLUX)
    ds = {"general": {"batch_size": 4}, "datasets": [{"subsets": [{"image_dir": "i"}]}]}
    assert a != history.fingerprint(CFG, FLUX, ds)
