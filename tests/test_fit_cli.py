"""`kohya-tuner fit`: writes a fitted copy, never over the user's files, and explains each change."""

from __future__ import annotations

import json

import pytest
import toml
from tests.clihelp import invoke as _invoke_cli

from tests.refdata import shared_path
from kohya_tuner import config_io, schema
from kohya_tuner.memory import budget_gib, estimate

REAL = ["01_kohya-ss_sd-scripts_648.toml", "05_bmaltais_kohya_ss_156.sh", "09_cocktailpeanut_fluxgym_360.sh",
        "11_bmaltais_kohya_ss_1184.json"]

HEAVY_SDXL = ('mixed_precision = "bf16"\nnetwork_module = "networks.lora"\nnetwork_dim = 64\nnetwork_alpha = 32.0\n'
              'optimizer_type = "AdamW"\nresolution = "1024"\ntrain_batch_size = 4\nsdpa = true\n'
              'output_name = "mine"\n')


def invoke(*args):
    return _invoke_cli(*[str(a) for a in args])


@pytest.mark.parametrize("name", REAL)
@pytest.mark.parametrize("gb", [8, 24])
def test_fit_on_every_real_config(name, gb, tmp_path):
    src = shared_path("real-world", "configs", name)
    before = src.read_bytes()
    out = tmp_path / "fitted.toml"
    res = invoke("fit", src, "--gpu", gb, "--out", out, "--json")
    data = json.loads(res.stdout)
    assert src.read_bytes() == before
    if data["fits"]:
        assert res.exit_code == 0
        loaded = config_io.read_config(out)
        original = config_io.read_config(src)
        fam = original.family
        assert estimate(loaded.config, fam).peak_gib <= budget_gib(gb) + 1e-6

        def errors(cfg):
            return {str(p) for p in schema.errors_only(schema.validate_config(cfg, fam.script, family=fam))}

        assert errors(loaded.config) <= errors(original.config)  # fitting adds no problem
    else:
        assert res.exit_code == 1 and not out.exists()
        assert data["message"].startswith(f"cannot fit in {gb} GB; the smallest config needs")


def test_fit_writes_changes_with_costs_and_reasons(tmp_path):
    src = tmp_path / "mine.toml"
    src.write_text(HEAVY_SDXL, encoding="utf-8")
    out = tmp_path / "mine.8gb.toml"
    res = invoke("fit", src, "--model", "sdxl", "--gpu", "8", "--out", out, "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["fits"] and data["steps"] and data["out"] == str(out)
    for st in data["steps"]:
        assert st["saved_gib"] > 0 and st["speed_cost"] and st["quality_cost"]
        for ch in st["changes"]:
            assert {"key", "old", "new"} <= set(ch)
    written = toml.load(out)
    flat = config_io.flatten(written)
    assert flat["output_name"] == "mine"  # untouched settings survive
    assert flat["train_batch_size"] * flat.get("gradient_accumulation_steps", 1) == 4
    text = out.read_text()
    assert "kohya-tuner fit for 8 GB" in text  # each changed key explains itself
    assert src.read_text() == HEAVY_SDXL


def test_fit_table_output(tmp_path):
    src = tmp_path / "mine.toml"
    src.write_text(HEAVY_SDXL, encoding="utf-8")
    res = invoke("fit", src, "--model", "sdxl", "--gpu", "12", "--out", tmp_path / "o.toml")
    assert res.exit_code == 0, res.output
    assert "fits in 12 GB" in res.stdout and "Changes" in res.stdout


def test_fit_never_writes_over_the_input_or_an_existing_file(tmp_path):
    src = tmp_path / "mine.toml"
    src.write_text(HEAVY_SDXL, encoding="utf-8")
    res = invoke("fit", src, "--model", "sdxl", "--gpu", "12", "--out", src)
    assert res.exit_code == 2 and src.read_text() == HEAVY_SDXL
    res = invoke("fit", src, "--model", "sdxl", "--gpu", "12", "--out", src, "--force")
    assert res.exit_code == 2 and src.read_text() == HEAVY_SDXL
    other = tmp_path / "other.toml"
    other.write_text("# mine\n", encoding="utf-8")
    res = invoke("fit", src, "--model", "sdxl", "--gpu", "12", "--out", other)
    assert res.exit_code == 2 and other.read_text() == "# mine\n"
    res = invoke("fit", src, "--model", "sdxl", "--gpu", "12", "--out", other, "--force")
    assert res.exit_code == 0
    assert (tmp_path / "other.toml.bak").read_text() == "# mine\n"


def test_fit_that_cannot_fit_writes_nothing(tmp_path):
    src = tmp_path / "mine.toml"
    # FLUX trains with networks.lora_flux; networks.lora is refused for it (check rule).
    src.write_text(HEAVY_SDXL.replace('"networks.lora"', '"networks.lora_flux"'), encoding="utf-8")
    out = tmp_path / "o.toml"
    res = invoke("fit", src, "--model", "flux", "--gpu", "4", "--out", out)
    assert res.exit_code == 1
    assert "cannot fit in 4 GB; the smallest config needs" in res.stdout
    assert not out.exists()


def test_fit_changes_the_dataset_copy_when_it_holds_the_batch(tmp_path):
    src = tmp_path / "mine.toml"
    src.write_text(HEAVY_SDXL.replace("train_batch_size = 4\n", "gradient_checkpointing = true\n"),
                   encoding="utf-8")
    ds = tmp_path / "dataset.toml"
    ds_text = '[general]\nbatch_size = 4\nresolution = 1024\n[[datasets]]\n[[datasets.subsets]]\nimage_dir = "img"\n'
    ds.write_text(ds_text, encoding="utf-8")
    out = tmp_path / "fitted.toml"
    res = invoke("fit", src, "--model", "sdxl", "--dataset", ds, "--gpu", "8", "--out", out, "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert ds.read_text() == ds_text
    if data["dataset_out"]:
        new_ds = toml.load(data["dataset_out"])
        cfg = config_io.flatten(toml.load(out))
        assert cfg["dataset_config"] == str((tmp_path / "fitted.dataset.toml").absolute())
        assert new_ds["general"]["batch_size"] * cfg.get("gradient_accumulation_steps", 1) == 4


def test_roadmap_policy_and_bad_options(tmp_path):
    src = tmp_path / "mine.toml"
    src.write_text(HEAVY_SDXL, encoding="utf-8")
    res = invoke("fit", src, "--model", "sdxl", "--gpu", "8", "--out", tmp_path / "r.toml", "--policy", "roadmap",
                 "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["steps"][0]["move"] == "batch_to_accumulation"
    assert invoke("fit", src, "--model", "sdxl", "--gpu", "8", "--out", tmp_path / "x.toml",
                  "--policy", "random").exit_code == 2
    assert invoke("fit", src, "--model", "sdxl", "--gpu", "twelve", "--out", tmp_path / "x.toml").exit_code == 2


@pytest.mark.parametrize("model,gb", [("sd15", 6), ("sdxl", 8), ("sdxl", 24), ("flux", 12), ("flux", 24)])
def test_estimate_and_fit_read_what_config_writes(model, gb, tmp_path):
    made = invoke("config", "--model", model, "--job", "character", "--gpu", gb, "--out", tmp_path / "run")
    if made.exit_code != 0:
        pytest.skip(f"config did not write files for {model} {gb} GB: {made.output[-200:]}")
    cfg = tmp_path / "run" / "config.toml"
    est = invoke("estimate", cfg, "--json")
    assert est.exit_code == 0, est.output
    data = json.loads(est.stdout)
    assert data["model"] == model
    out = tmp_path / "fitted.toml"
    fitted = invoke("fit", cfg, "--gpu", gb, "--out", out, "--json")
    assert fitted.exit_code in (0, 1), fitted.output
    assert json.loads(fitted.stdout)["model"] == model


@pytest.mark.parametrize("gpus", [1, 2, 4])
@pytest.mark.parametrize("gb", [11, 16])
def test_a_fit_for_several_gpus_fits_each_of_them(gpus, gb, tmp_path):
    """Each rank holds the whole model and DDP's gradient buckets: what `fit --gpus N` writes, the
    per-card estimate for N GPUs says fits."""
    src = tmp_path / "heavy.toml"
    src.write_text(HEAVY_SDXL)
    out = tmp_path / "fitted.toml"
    res = invoke("fit", src, "--model", "sdxl", "--gpu", gb, "--gpus", gpus, "--out", out, "--json")
    assert res.exit_code == 0, res.stdout + res.stderr
    fitted = config_io.read_config(out, model="sdxl")
    per_card = estimate(fitted.config, fitted.family, gpus=gpus).peak_gib
    assert per_card <= budget_gib(gb) + 1e-6
    assert json.loads(res.stdout)["after"]["peak_gib"] == pytest.approx(per_card, abs=1e-3)
