"""Caches already on disk: the folders are listed (never opened) for the files sd-scripts would read, and a
caching phase whose files are all there encodes nothing."""

from pathlib import Path

import pytest

from kohya_tuner.dataset.caches import done_phases
from kohya_tuner.families import FAMILIES
from kohya_tuner.memory import estimate


def _folder(tmp_path: Path, files: list[str]) -> Path:
    d = tmp_path / "img"
    d.mkdir()
    for f in files:
        (d / f).write_bytes(b"")
    return d


def _ds(d: Path) -> dict:
    return {"datasets": [{"subsets": [{"image_dir": str(d)}]}]}


FLUX_TO_DISK = {"cache_latents": True, "cache_latents_to_disk": True, "cache_text_encoder_outputs": True,
                "cache_text_encoder_outputs_to_disk": True}


def test_flux_all_present(tmp_path):
    d = _folder(tmp_path, ["a.png", "a_1024x1024_flux.npz", "a_flux_te.npz", "b.jpg", "b_0832x1216_flux.npz",
                           "b_flux_te.npz", "b.txt"])
    assert done_phases("flux", FLUX_TO_DISK, _ds(d)) == {"cache_latents", "cache_text_encoder"}


def test_one_missing_file_keeps_the_phase(tmp_path):
    d = _folder(tmp_path, ["a.png", "a_1024x1024_flux.npz", "a_flux_te.npz", "b.png", "b_flux_te.npz",
                           "b_1024x1024_sdxl.npz"])
    assert done_phases("flux", FLUX_TO_DISK, _ds(d)) == {"cache_text_encoder"}


def test_in_memory_caching_is_encoded_again(tmp_path):
    d = _folder(tmp_path, ["a.png", "a_1024x1024_flux.npz", "a_flux_te.npz"])
    cfg = {"cache_latents": True, "cache_text_encoder_outputs": True}
    assert done_phases("flux", cfg, _ds(d)) == frozenset()


def test_sd_old_npz_and_kohya_folder_layout(tmp_path):
    root = tmp_path / "train"
    (root / "10_cat").mkdir(parents=True)
    for f in ("x.png", "x.npz", "y.webp", "y_0512x0512_sd.npz"):
        (root / "10_cat" / f).write_bytes(b"")
    cfg = {"cache_latents": True, "cache_latents_to_disk": True, "train_data_dir": str(root)}
    assert done_phases("sd15", cfg, None) == {"cache_latents"}
    # an SDXL run reads *_sdxl.npz: the SD 1.5 files are not its caches (the old <stem>.npz is)
    (root / "10_cat" / "y_0512x0512_sd.npz").unlink()
    assert done_phases("sdxl", cfg, None) == frozenset()


def test_no_images_no_claim(tmp_path):
    d = _folder(tmp_path, ["a_flux_te.npz"])
    assert done_phases("flux", FLUX_TO_DISK, _ds(d)) == frozenset()


def test_estimate_drops_the_encode_but_not_the_weights():
    fam = FAMILIES["flux"]
    cfg = {"mixed_precision": "bf16", "network_module": "networks.lora_flux", "network_dim": 16, "fp8_base": True,
           "gradient_checkpointing": True, "network_train_unet_only": True, "resolution": "1024,1024",
           "vae_batch_size": 4, **FLUX_TO_DISK}
    before = estimate(cfg, fam)
    after = estimate(cfg, fam, caches_done=frozenset({"cache_latents", "cache_text_encoder"}))
    for phase in ("cache_latents", "cache_text_encoder"):
        b, a = before.phase_components_gib[phase], after.phase_components_gib[phase]
        assert b["activations"] > 0 and a["activations"] == 0
        assert {k: v for k, v in a.items() if k.endswith("_weights")} == \
            {k: v for k, v in b.items() if k.endswith("_weights")}
    assert after.phases_gib["training"] == pytest.approx(before.phases_gib["training"])
    assert sum("already has its" in x for x in after.assumptions) == 2


def test_a_phase_the_config_does_not_run_is_not_claimed():
    fam = FAMILIES["sdxl"]
    e = estimate({"mixed_precision": "bf16", "network_module": "networks.lora"}, fam,
                 caches_done=frozenset({"cache_latents"}))
    assert not any("already has its" in x for x in e.assumptions)


def test_estimate_and_fit_read_the_same_caches(tmp_path):
    import json

    from tests.clihelp import invoke

    d = _folder(tmp_path, ["a.png", "a_1024x1024_sdxl.npz", "a_te_outputs.npz"])
    (tmp_path / "dataset.toml").write_text(
        f'[general]\nresolution = 1024\n[[datasets]]\nbatch_size = 1\n[[datasets.subsets]]\nimage_dir = "{d}"\n',
        encoding="utf-8")
    cfg = tmp_path / "config.toml"
    cfg.write_text('pretrained_model_name_or_path = "/m/sd_xl_base_1.0.safetensors"\nnetwork_module = "networks.lora"\n'
                   'mixed_precision = "bf16"\nsdpa = true\ncache_latents = true\ncache_latents_to_disk = true\n'
                   f'output_dir = "{tmp_path / "out"}"\ndataset_config = "{tmp_path / "dataset.toml"}"\n'
                   'network_train_unet_only = true\ngradient_checkpointing = true\n', encoding="utf-8")
    est = json.loads(invoke("estimate", cfg, "--model", "sdxl", "--json").stdout)
    fit = json.loads(invoke("fit", cfg, "--model", "sdxl", "--gpu", "24", "--out", tmp_path / "f.toml", "--json").stdout)
    assert est["phases_gib"]["cache_latents"] == fit["after"]["phases_gib"]["cache_latents"]
    assert any("latent cache file" in a for a in est["assumptions"])
    (d / "a_1024x1024_sdxl.npz").unlink()
    again = json.loads(invoke("estimate", cfg, "--model", "sdxl", "--json").stdout)
    assert again["phases_gib"]["cache_latents"] > est["phases_gib"]["cache_latents"]
    assert not any("latent cache file" in a for a in again["assumptions"])
