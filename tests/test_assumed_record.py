"""config, estimate and fit count the same plan: what config assumed is read back from the file."""

from __future__ import annotations

import json

import pytest
import toml

from kohya_tuner import assumed, config_io
from kohya_tuner.families import FAMILIES
from tests.clihelp import invoke


def test_comment_block_reads_back_and_sd_scripts_parser_ignores_it():
    block = assumed.comment_block({"t5xxl": "t5xxl_fp8_e4m3fn.safetensors", "vae": "a b\"c.safetensors"})
    text = block + "[memory]\nfp8_base = true\n"
    assert assumed.parse(text) == {"t5xxl": "t5xxl_fp8_e4m3fn.safetensors", "vae": "a b\"c.safetensors"}
    # toml 0.10.2 (sd-scripts' read_config_from_file) sees only the settings.
    assert config_io.flatten(toml.loads(text)) == {"fp8_base": True}


def test_a_value_the_file_sets_wins_over_the_assumed_one():
    merged, used = assumed.merge({"t5xxl": "/models/t5.safetensors"}, {"t5xxl": "t5xxl_fp8_e4m3fn.safetensors"})
    assert merged["t5xxl"] == "/models/t5.safetensors" and used == {}
    merged, used = assumed.merge({}, {"t5xxl": "x"})
    assert merged == {"t5xxl": "x"} and assumed.unmerge(merged, used) == {}


@pytest.mark.parametrize("model", sorted(FAMILIES))
@pytest.mark.parametrize("gb", [8, 16])
def test_config_fit_and_estimate_agree_on_the_written_file(model, gb, tmp_path):
    out = tmp_path / "plan"
    res = invoke("config", "--model", model, "--job", "character", "--gpu", str(gb), "--gpu-arch", "ampere",
                 "--out", str(out), "--json")
    if res.exit_code == 2:
        pytest.skip(f"no {model} plan fits {gb} GB")
    assert res.exit_code == 0, res.output
    planned = json.loads(res.stdout)
    cfg = out / "config.toml"
    est = invoke("estimate", str(cfg), "--gpu", str(gb), "--no-history", "--json")
    assert est.exit_code == 0, est.output
    est = json.loads(est.stdout)
    assert est["peak_gib"] == pytest.approx(planned["estimate"]["peak_gib"], abs=1e-3)
    assert est["peak_phase"] == planned["estimate"]["peak_phase"]
    fitted = invoke("fit", str(cfg), "--gpu", str(gb), "--no-history", "--out", str(tmp_path / "f.toml"), "--json")
    assert fitted.exit_code == 0, fitted.output
    fitted = json.loads(fitted.stdout)
    assert fitted["fits"] and fitted["steps"] == []
    assert fitted["before"]["peak_gib"] == pytest.approx(planned["estimate"]["peak_gib"], abs=1e-3)
    # The same sentences for what the plan assumes, in all three.
    for line in planned["assumptions"]:
        if "the plan assumes it" in line:
            assert line in est["assumptions"] and line in fitted["assumptions"]
    # The fitted file carries the assumption on as a comment, not as a setting.
    text = (tmp_path / "f.toml").read_text()
    assert assumed.parse(text) == assumed.parse(cfg.read_text())
    for key in assumed.parse(text):
        assert key not in config_io.flatten(toml.loads(text))


def _lycoris(text: str) -> str:
    lines = [ln for ln in text.splitlines() if not ln.startswith(("network_module", "network_args"))]
    return "\n".join(lines) + '\n[lycoris]\nnetwork_module = "lycoris.kohya"\nnetwork_args = ["algo=locon"]\n'


def _no_te_cache(text: str) -> str:
    return "\n".join(ln for ln in text.splitlines() if not ln.startswith("cache_text_encoder_outputs")) + "\n"


def _swap(text: str) -> str:
    lines = [ln for ln in text.splitlines() if not ln.startswith("blocks_to_swap")]
    return "\n".join(lines) + "\n[swap]\nblocks_to_swap = 4\n"


def _generic_model(text: str) -> str:
    lines = [ln for ln in text.splitlines() if not ln.startswith("pretrained_model_name_or_path")]
    return "\n".join(lines) + '\n[base]\npretrained_model_name_or_path = "/models/model.safetensors"\n'


EDITS = {"lycoris": _lycoris, "no_te_cache": _no_te_cache, "block_swap": _swap, "generic_model_name": _generic_model}


@pytest.mark.parametrize("edit", sorted(EDITS))
@pytest.mark.parametrize("model", sorted(FAMILIES))
def test_a_written_plan_keeps_its_family_through_an_ordinary_edit(model, edit, tmp_path):
    out = tmp_path / "plan"
    res = invoke("config", "--model", model, "--job", "style", "--gpu", "24", "--gpu-arch", "ampere", "--out", str(out))
    if res.exit_code == 2:
        pytest.skip(f"no {model} plan for 24 GB")
    edited = tmp_path / "edited.toml"
    edited.write_text(EDITS[edit]((out / "config.toml").read_text(encoding="utf-8")), encoding="utf-8")
    loaded = config_io.read_config(edited)
    assert loaded.family is not None and loaded.family.name == model, (edit, loaded.family)
