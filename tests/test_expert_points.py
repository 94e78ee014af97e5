"""The settings a Kohya expert questioned (issue 9, item 7), each checked against the estimator.

a. rank/alpha come from the job and survive the fit wherever the estimate leaves room;
b. precision follows the card's architecture, fp16 with a caution when only a size is given;
c. a caution above 95 % of the budget and on cards under 6 GB;
d. the fp8 T5-XXL file offered first when T5 caching is what does not fit;
e. a guessed model family is an assumption, not a reading note;
f. sample-prompt settings in the presets, with a prompt file and their memory counted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import toml

from tests.refdata import shared_path
from kohya_tuner import config_io, gpu, ladder, planfiles, planning, presets, schema
from kohya_tuner.families import FAMILIES, get_family
from kohya_tuner.memory import budget_gib, estimate

JOB_RANK = {"character": 16, "style": 32, "concept": 16}
# SD3 / SD3.5 cache their captions with CLIP-L, CLIP-G and T5-XXL on the GPU together (sd3_train_network.py):
# with the fp8 T5-XXL file 6.4 GiB, over a 6 GB card's 5.5 GiB budget; their plans start at 8 GB.
# HunyuanImage-2.1: its guide's smallest tier is 8 GB (fp8_scaled, the maximum 37 blocks swapped);
# on the traced activation lines a rank-32 job does not fit 6 GB.
SMALLEST_FITTING_CLASS = {"sd3": 8, "sd35m": 8, "sd35l": 8, "hunyuan21": 8}


def fitted(model, job, gb, tmp_path, *, bf16=True, t5xxl=None, sets=(), trigger="ohwx"):
    family = get_family(model)
    inputs, _ = planning.model_inputs(family, base=None, clip_l=None, t5xxl=t5xxl, ae=None, name="x",
                                      out=tmp_path, steps=None)
    plan = presets.compose(model, job, gb, inputs=inputs, bf16=bf16, sets=list(sets))
    ds = presets.build_dataset(plan, tmp_path / "images", trigger)
    return planning.fit_plan(plan, ds, gb, bf16=bf16, use_history=False)


# ---- a. rank and alpha --------------------------------------------------------------------


@pytest.mark.parametrize("model", presets.preset_models())
@pytest.mark.parametrize("job", presets.JOBS)
def test_no_gpu_class_overrides_the_jobs_rank(model, job):
    for gb in presets.GPU_CLASSES:
        plan = presets.compose(model, job, gb, bf16=True)
        assert plan.provenance["network_dim"].layer == f"job:{job}", (model, job, gb)
        assert plan.config["network_alpha"] == plan.config["network_dim"] / 2, (model, job, gb)


@pytest.mark.parametrize("model", presets.preset_models())
@pytest.mark.parametrize("job", ["character", "style"])
def test_the_fit_keeps_the_jobs_rank_on_every_preset_class(model, job, tmp_path):
    """Measured: on every class from 6 GB up the estimate leaves room for the job's rank (FLUX
    6 GB needs the fp8 T5-XXL file, which the plan assumes)."""
    for gb in (6, 8, 10, 12, 16, 24):
        if gb < SMALLEST_FITTING_CLASS.get(model, 6):
            continue
        f = fitted(model, job, gb, tmp_path, bf16=True)
        assert f.fits, (model, job, gb, f.notes)
        cfg = f.plan.config
        assert cfg["network_dim"] == JOB_RANK[job], (model, job, gb, [s.move for s in f.fit.steps])
        assert cfg["network_alpha"] == cfg["network_dim"] / 2


def test_rank_costs_megabytes_on_sd15_at_6gb(tmp_path):
    """The old 6 GB preset cut SD 1.5 to rank 4 'to fit' at 66 % of the budget; the estimator
    puts rank 32 a quarter of a GiB above rank 4 there."""
    peaks = {r: fitted("sd15", "style", 6, tmp_path, sets=[f"network_dim={r}", f"network_alpha={r / 2}"])
             for r in (4, 32)}
    gap = peaks[32].estimate.peak_gib - peaks[4].estimate.peak_gib
    assert 0 < gap < 0.35
    assert peaks[32].estimate.peak_gib / peaks[32].budget_gib < 0.8


def test_the_fit_does_not_cut_rank_when_rank_does_not_set_the_peak(tmp_path):
    """FLUX on 6 GB: T5-XXL caching sets the peak, so a lower rank buys nothing there."""
    cfgs = {r: fitted("flux", "style", 6, tmp_path, t5xxl="/m/t5xxl_fp8_e4m3fn.safetensors",
                      sets=[f"network_dim={r}", f"network_alpha={r / 2}"]) for r in (4, 32)}
    assert cfgs[4].estimate.peak_phase == cfgs[32].estimate.peak_phase == "cache_text_encoder"
    assert cfgs[4].estimate.peak_gib == pytest.approx(cfgs[32].estimate.peak_gib)
    assert cfgs[32].plan.config["network_dim"] == 32
    assert cfgs[32].estimate.phases_gib["training"] > cfgs[4].estimate.phases_gib["training"]


def test_rank_is_cut_only_where_the_estimate_demands_it(tmp_path):
    """SDXL on a 4 GB card: the job's rank does not fit, the ladder lowers it and keeps alpha at half."""
    f = fitted("sdxl", "style", 4, tmp_path)
    assert f.fits and f.plan.config["network_dim"] < 32
    assert f.plan.config["network_alpha"] == f.plan.config["network_dim"] / 2
    assert f.plan.provenance["network_dim"].layer == "fit"


# ---- b. precision ---------------------------------------------------------------------------


@pytest.mark.parametrize("cc,arch", [((6, 1), "pascal"), ((7, 0), "volta"), ((7, 5), "turing"), ((8, 0), "ampere"),
                                     ((8, 6), "ampere"), ((8, 9), "ada"), ((9, 0), "hopper"), ((12, 0), "blackwell")])
def test_architecture_from_compute_capability(cc, arch):
    assert gpu.arch_for_capability(cc) == arch
    assert gpu.arch_has_bf16(arch) == (cc >= (8, 0))


def test_gpu_arch_names_and_refusals():
    assert gpu.parse_arch("Ampere") == "ampere" and gpu.parse_arch("RTX20") == "turing"
    assert gpu.parse_arch("lovelace") == "ada" and gpu.parse_arch("gtx10") == "pascal"
    with pytest.raises(gpu.UserError, match="turing"):
        gpu.parse_arch("kepler2")


def test_a_size_alone_leaves_bf16_unknown_and_gpu_arch_decides():
    assert gpu.choose("8").bf16 is None
    assert gpu.choose("8", arch="turing").bf16 is False
    assert gpu.choose("8", arch="ada").bf16 is True
    assert "turing" in gpu.choose("8", arch="turing").describe()


def test_gpu_arch_wins_over_nvml(monkeypatch):
    card = gpu.GpuInfo(index=0, name="NVIDIA GeForce RTX 3060", total_gib=12.0, free_gib=11.0, used_gib=1.0,
                       compute_capability=(8, 6))
    monkeypatch.setattr(gpu, "detect", lambda index=0: card)
    assert gpu.choose("auto").arch == "ampere" and gpu.choose("auto").bf16 is True
    planned = gpu.choose("auto", arch="turing")
    assert planned.bf16 is False and "--gpu-arch" in planned.describe()


@pytest.mark.parametrize("model", presets.preset_models())
def test_manual_8gb_class_trains_in_fp16_with_a_caution(model):
    plan = presets.compose(model, "style", 8)
    doc = presets._load_toml(presets.presets_dir() / "models" / f"{model}.toml", "Preset")
    if presets.required_precision(doc):  # a bf16-only family keeps bf16, its caution names the cards
        assert plan.config["mixed_precision"] == "bf16" and "RTX 20xx" in " ".join(plan.cautions)
        return
    assert plan.config["mixed_precision"] == "fp16"
    assert plan.provenance["mixed_precision"].layer == "gpu:unknown"
    caution = presets.precision_caution(plan)
    assert caution and "--gpu-arch" in caution and "RTX 2070" in caution
    if get_family(model).fp16_vae_overflows:
        assert plan.config["no_half_vae"] is True
    else:
        assert plan.config["save_precision"] == "fp16"


def test_known_architecture_decides_without_a_caution():
    ampere = presets.compose("sdxl", "style", 6, bf16=True)  # an RTX 3060 laptop card
    assert ampere.config["mixed_precision"] == "bf16" and presets.precision_caution(ampere) is None
    turing = presets.compose("sdxl", "style", 8, bf16=False)
    assert turing.config["mixed_precision"] == "fp16" and presets.precision_caution(turing) is None


def test_classes_without_pre_ampere_cards_keep_bf16():
    for gb in (20, 80):
        plan = presets.compose("sd15", "style", gb)
        assert plan.config["mixed_precision"] == "bf16" and presets.precision_caution(plan) is None


def test_a_later_layer_that_sets_precision_drops_the_caution():
    plan = presets.compose("sd15", "style", 8, sets=["mixed_precision=bf16"])
    assert plan.config["mixed_precision"] == "bf16" and presets.precision_caution(plan) is None


def test_gpu_arch_flag_parses_architectures():
    import argparse

    from kohya_tuner.cli import plan_options

    p = argparse.ArgumentParser()
    plan_options.add_gpu(p, required=True, arch=True)
    assert p.parse_args(["--gpu", "8", "--gpu-arch", "RTX30"]).gpu_arch == "ampere"
    with pytest.raises(SystemExit):
        p.parse_args(["--gpu", "8", "--gpu-arch", "nonsense"])


@pytest.mark.parametrize("arch,precision,cautioned", [("turing", "fp16", False), ("ada", "bf16", False),
                                                      (None, "fp16", True)])
def test_config_gpu_arch_decides_the_precision(tmp_path, arch, precision, cautioned):
    from tests.clihelp import invoke

    args = ["config", "--model", "sd15", "--job", "style", "--gpu", "8", "--out", str(tmp_path / "o"), "--json"]
    res = invoke(*(args + (["--gpu-arch", arch] if arch else [])))
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["config"]["mixed_precision"] == precision
    assert any("--gpu-arch" in c for c in data["cautions"]) == cautioned


# ---- c. cautions ----------------------------------------------------------------------------


def test_cautions_thresholds():
    # The threshold is on the card's share as a monitor counts it: the allocator's peak and the CUDA
    # context over the budget and the context (the budget leaves the context out).
    from kohya_tuner.memory.monitor import context_gib

    b, ctx = budget_gib(8), context_gib(None)
    assert ladder.cautions(0.95 * (b + ctx) - ctx, b, 8) == []
    assert "96%" in ladder.cautions(0.96 * (b + ctx) - ctx, b, 8)[0]
    small = ladder.cautions(0.5 * budget_gib(4), budget_gib(4), 4)
    assert len(small) == 1 and "4 GB card is below the smallest preset class (6 GB)" in small[0]


def test_a_4gb_card_filled_to_the_brim_gets_both_cautions(tmp_path):
    # The reported case: `--gpu 4` by hand, "fits: 3.59 of 3.61 GiB (100%)" and no word of warning.
    f = fitted("sdxl", "character", 4, tmp_path, bf16=None)
    assert f.fits and f.estimate.peak_gib / f.budget_gib > 0.95
    assert any("of the card" in c for c in f.cautions)
    assert any("below the smallest preset class" in c for c in f.cautions)
    assert any("--gpu-arch" in c for c in f.cautions)
    assert f.fit.cautions  # the fit result carries them too (`fit` prints them)


def test_a_comfortable_plan_has_no_caution(tmp_path):
    f = fitted("sd15", "character", 6, tmp_path, bf16=True)
    assert f.fits and f.estimate.peak_gib / f.budget_gib < 0.8
    assert f.cautions == []


def test_manual_class_caution_reaches_the_fitted_plan(tmp_path):
    f = fitted("sd15", "character", 8, tmp_path, bf16=None)
    assert any("--gpu-arch" in c for c in f.cautions)


# ---- d. the fp8 T5-XXL file ---------------------------------------------------------------


def test_flux_6gb_with_a_16bit_t5_offers_the_fp8_file_not_a_smaller_rank(tmp_path):
    f = fitted("flux", "character", 6, tmp_path, t5xxl="/m/t5xxl_fp16.safetensors")
    assert not f.fits and f.estimate.peak_phase == "cache_text_encoder"
    assert f.fit.offer["key"] == "t5xxl" and f.fit.offer["value"] == "t5xxl_fp8_e4m3fn.safetensors"
    assert f.fit.offer["peak_gib"] <= f.budget_gib
    assert "t5xxl_fp8_e4m3fn.safetensors" in f.fit.message
    assert f.fit.hints[0].startswith("T5-XXL sets this peak")
    hint = f.refusal_hint
    assert "--t5xxl" in hint and "t5xxl_fp8_e4m3fn" in hint and "network_dim" not in hint
    # The offered file does fit: same plan, fp8 file given.
    again = fitted("flux", "character", 6, tmp_path, t5xxl="/m/t5xxl_fp8_e4m3fn.safetensors")
    assert again.fits and again.estimate.peak_gib == pytest.approx(f.fit.offer["peak_gib"], abs=0.01)


def test_no_t5_given_plans_for_the_fp8_file(tmp_path):
    f = fitted("flux", "style", 6, tmp_path)
    assert f.fits and f.assumed == {"t5xxl": "t5xxl_fp8_e4m3fn.safetensors"}


def test_no_offer_when_the_file_would_not_help(tmp_path):
    f = fitted("flux", "character", 4, tmp_path, t5xxl="/m/t5xxl_fp16.safetensors")
    # Even the fp8 file leaves T5 caching over a 4 GB budget: no file to offer, and since caching
    # sets the peak, no LoRA setting either.
    assert not f.fits and f.fit.offer is None and f.estimate.peak_phase == "cache_text_encoder"
    assert "text encoders" in f.refusal_hint and "network_dim" not in f.refusal_hint


def test_fit_command_floor_message_keeps_its_shape_and_names_the_file():
    loaded = config_io.read_config(shared_path("real-world", "configs", "09_cocktailpeanut_fluxgym_360.sh"))
    r = ladder.fit(loaded.config, loaded.family, budget_gib(8), gpu_gb=8)
    assert not r.fits and r.message.startswith("cannot fit in 8 GB; the smallest config needs")
    assert "t5xxl_fp8_e4m3fn.safetensors" in r.message and r.offer is not None


# ---- e. guessed model family --------------------------------------------------------------


def test_truncated_gui_json_lists_the_guess_as_an_assumption():
    loaded = config_io.read_config(shared_path("real-world", "configs", "11_bmaltais_kohya_ss_1184.json"))
    assert loaded.family.name == "sd15"
    assert len(loaded.assumptions) == 1 and "SD 1.5" in loaded.assumptions[0]
    assert "--model" in loaded.assumptions[0] and any("cut short" in n for n in loaded.notes)
    assert not any("SD 1.5" in n for n in loaded.notes)
    stated = config_io.read_config(shared_path("real-world", "configs", "11_bmaltais_kohya_ss_1184.json"),
                                   model="sdxl")
    assert stated.family.name == "sdxl" and stated.assumptions == []


def test_gui_json_family_from_flags_is_no_guess(tmp_path):
    f = tmp_path / "gui.json"
    f.write_text(json.dumps({"sdxl": True, "network_dim": 32}))
    assert config_io.read_config(f).assumptions == []
    g = tmp_path / "g.json"
    g.write_text(json.dumps({"pretrained_model_name_or_path": "/m/ponyXL_v6.safetensors", "network_dim": 8}))
    loaded = config_io.read_config(g)
    # The GUI launches train_network.py without its SDXL box ticked (tests/data/kohya_gui): the name is only a hint.
    assert loaded.family.name == "sd15" and "'xl'" in loaded.assumptions[0]


def test_estimate_cli_puts_the_guess_in_assumptions():
    from tests.clihelp import invoke

    path = shared_path("real-world", "configs", "11_bmaltais_kohya_ss_1184.json")
    data = json.loads(invoke("estimate", str(path), "--json").stdout)
    assert any("SD 1.5" in a and "--model" in a for a in data["assumptions"])


# ---- f. sample prompts ----------------------------------------------------------------------


@pytest.mark.parametrize("model", presets.preset_models())
@pytest.mark.parametrize("job", presets.JOBS)
def test_every_job_samples_with_each_saved_lora(model, job):
    cfg = presets.compose(model, job, 24, bf16=True).config
    assert cfg["sample_every_n_steps"] == cfg["save_every_n_steps"]
    specs = schema.script_args(get_family(model).script)
    if get_family(model).uses_sample_sampler:  # the DiT scripts (FLUX.1 ...) ignore sample_sampler
        sampler = cfg["sample_sampler"]
        assert sampler in specs["sample_sampler"].choices
    assert schema.errors_only(schema.validate_config(cfg, get_family(model).script)) == []


def test_config_writes_the_prompt_file_with_the_trigger_and_training_size(tmp_path):
    f = fitted("sdxl", "character", 24, tmp_path, trigger="ohwx woman")
    cfg = f.plan.config
    assert cfg["sample_prompts"] == str((tmp_path / presets.SAMPLE_PROMPTS_NAME).absolute())
    files = planfiles.render(f.plan, f.dataset, tmp_path)
    text = files.texts[presets.SAMPLE_PROMPTS_NAME]
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert len(lines) == len(f.plan.sample_prompts) >= 1
    assert all(ln.startswith("ohwx woman") and "--w 1024 --h 1024" in ln for ln in lines)
    written = planfiles.write(files, tmp_path)
    assert written[presets.SAMPLE_PROMPTS_NAME].read_text() == text
    assert config_io.flatten(toml.loads(files.texts["config.toml"]))["sample_prompts"] == cfg["sample_prompts"]


def test_flux_prompts_have_no_cfg_options(tmp_path):
    f = fitted("flux", "style", 24, tmp_path, trigger="inkwash")
    lines = [ln for ln in presets.sample_prompts_text(f.plan, f.dataset).splitlines() if not ln.startswith("#")]
    assert lines and all("inkwash style" in ln and "--s 20" in ln for ln in lines)
    assert not any("--l " in ln or "--n " in ln for ln in lines)  # FLUX.1 samples without CFG, as estimated
    plan = presets.compose("flux", "style", 24, variant="schnell", bf16=True)
    assert plan.sample_options.startswith("--w {w} --h {h} --s 4")


def test_own_prompt_file_is_not_overwritten(tmp_path):
    mine = tmp_path / "mine.txt"
    f = fitted("sd15", "style", 12, tmp_path, sets=[f"sample_prompts={mine}"])
    assert presets.sample_prompts_text(f.plan, f.dataset) is None
    assert presets.SAMPLE_PROMPTS_NAME not in planfiles.render(f.plan, f.dataset, tmp_path).texts


def test_sampling_memory_is_counted_and_dropped_where_it_does_not_fit(tmp_path):
    roomy = fitted("sdxl", "style", 24, tmp_path)
    assert roomy.estimate.settings["sampling"] is True and "sampling" in roomy.estimate.phases_gib
    assert roomy.estimate.peak_phase == "sampling"  # SDXL brings both text encoders back in fp32
    tight = fitted("sdxl", "style", 8, tmp_path)
    assert tight.fits and "sample_every_n_steps" not in tight.plan.config
    assert any(s.move == "sample_less" for s in tight.fit.steps)
    # Without the sample cadence the same plan would not need the move: the sampling phase was the limit.
    assert tight.estimate.settings["sampling"] is False


def test_presets_without_prompts_write_no_file(tmp_path):
    plan = presets.compose("sd15", "style", 12, bf16=True)
    plan.sample_prompts = []
    assert presets.sample_prompts_text(plan, {}) is None


# ---- through the CLI --------------------------------------------------------------------------


def test_config_json_carries_the_cautions(tmp_path):
    from tests.clihelp import invoke

    res = invoke("config", "--model", "sdxl", "--job", "character", "--gpu", "4", "--out", str(tmp_path / "o"),
                 "--json")
    assert res.exit_code == 0, res.output
    cautions = json.loads(res.stdout)["cautions"]
    assert any("of the card" in c for c in cautions)
    assert any("below the smallest preset class" in c for c in cautions)
    assert any("--gpu-arch" in c for c in cautions)
    assert (tmp_path / "o" / presets.SAMPLE_PROMPTS_NAME).is_file()


def test_config_refusal_for_flux_with_a_16bit_t5_names_the_fp8_file(tmp_path):
    from tests.clihelp import invoke

    res = invoke("config", "--model", "flux", "--job", "character", "--gpu", "6", "--out", str(tmp_path / "o"),
                 "--t5xxl", str(tmp_path / "t5xxl_fp16.safetensors"), "--json")
    assert res.exit_code == 2
    error = json.loads(res.stdout)["error"]
    assert "t5xxl_fp8_e4m3fn.safetensors" in error["message"]
    assert "--t5xxl" in error["hint"] and "network_dim" not in error["hint"]
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())
