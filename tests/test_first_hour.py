"""What a newcomer meets in the first hour: presets, plans and the messages around them."""

from __future__ import annotations

import json

import pytest

from kohya_tuner import presets
from tests.clihelp import invoke


def _config(tmp_path, *args):
    res = invoke("config", *args, "--out", tmp_path / "out", "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.mark.parametrize("model", ["hunyuan21", "lumina2", "anima"])
def test_bf16_only_family_keeps_bf16_on_an_unknown_card_and_names_the_cards(model, tmp_path):
    data = _config(tmp_path, "--model", model, "--job", "style", "--gpu", "24")
    assert data["config"]["mixed_precision"] == "bf16"
    caution = " ".join(data["cautions"])
    assert "bf16" in caution and "compute capability below 8.0" in caution and "RTX 20xx" in caution


def test_bf16_only_family_passes_its_own_check(tmp_path):
    _config(tmp_path, "--model", "hunyuan21", "--job", "style", "--gpu", "24")
    res = invoke("check", tmp_path / "out" / "config.toml")
    assert "wants mixed_precision bf16" not in res.output


def test_other_families_still_take_fp16_on_an_unknown_card(tmp_path):
    data = _config(tmp_path, "--model", "sdxl", "--job", "style", "--gpu", "24")
    assert data["config"]["mixed_precision"] == "fp16"


def test_bf16_requirement_is_data_in_the_model_preset():
    from kohya_tuner.presets import _load_toml, required_precision
    from kohya_tuner.resources import presets_dir

    needs = {p.stem for p in (presets_dir() / "models").glob("*.toml")
             if required_precision(_load_toml(p, "Preset"))}
    assert "hunyuan21" in needs and "sdxl" not in needs and "sd15" not in needs


def test_chroma_samples_disable_embedded_guidance(tmp_path):
    _config(tmp_path, "--model", "chroma", "--job", "character", "--gpu", "24", "--gpu-arch", "ampere",
            "--trigger", "ohwx")
    lines = [ln for ln in (tmp_path / "out" / "sample_prompts.txt").read_text().splitlines()
             if not ln.startswith("#")]
    assert lines and all("--g 0" in ln and "--n " in ln and "--l " in ln for ln in lines)


@pytest.mark.parametrize("template", ["a lighthouse at sunset, {trigger} style", "{trigger}, a portrait photo",
                                      "a {trigger} on a table"])
def test_prompt_without_trigger_has_no_double_space_or_stray_comma(template):
    text = presets.fill_trigger(template, "")
    assert "  " not in text and " ," not in text and not text.startswith(",") and "{trigger}" not in text
    assert "ohwx" in presets.fill_trigger(template, "ohwx")


def test_missing_base_file_is_a_warning_but_a_hub_id_is_not(tmp_path):
    res = invoke("config", "--model", "sdxl", "--job", "style", "--gpu", "12", "--out", tmp_path / "a",
                 "--base", "/nonexistent/model.safetensors", "--json")
    assert res.exit_code == 0
    assert any("/nonexistent/model.safetensors does not exist" in w for w in json.loads(res.stdout)["warnings"])
    res = invoke("config", "--model", "sdxl", "--job", "style", "--gpu", "12", "--out", tmp_path / "b",
                 "--base", "stabilityai/stable-diffusion-xl-base-1.0", "--json")
    assert not any("does not exist" in w for w in json.loads(res.stdout)["warnings"])


def test_missing_checkout_warning_names_the_variable_config_reads(tmp_path):
    data = _config(tmp_path, "--model", "sd15", "--job", "style", "--gpu", "12")
    text = " ".join(data["warnings"])
    assert "KOHYA_SD_SCRIPTS" in text and "set SD_SCRIPTS" not in text


def test_jpeg_cut_off_in_its_headers_is_called_truncated_not_a_permission_problem(tmp_path):
    from PIL import Image

    from kohya_tuner.dataset.images import inspect_image

    whole = tmp_path / "whole.jpg"
    Image.new("RGB", (256, 256), (200, 40, 90)).save(whole, quality=90)
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(whole.read_bytes()[:400])
    info = inspect_image(str(cut))
    assert info["problems"] == ["truncated"], info
    res = invoke("dataset", "check", tmp_path, "-m", "sdxl")
    assert "truncated" in res.output and "permissions" not in res.output


def _images(folder, n=12, size=(768, 1024)):
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.new("RGB", size, (i * 20, 30, 200)).save(folder / f"{i}.png")
        (folder / f"{i}.txt").write_text(f"a photo number {i}")
    return folder


def test_dry_run_without_a_checkout_plans_and_prints_the_command_with_a_placeholder(tmp_path):
    from kohya_tuner.run.preflight import PLACEHOLDER

    base = tmp_path / "base.safetensors"
    base.write_bytes(b"x")
    res = invoke("run", "--model", "sd15", "--job", "character", "--gpu", "12", "--data", _images(tmp_path / "d"),
                 "--out", tmp_path / "r", "--base", base, "--dry-run", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert any(f"{PLACEHOLDER}/train_network.py" in a for a in data["command"])
    assert any(c["name"] == "sd-scripts" and c["status"] == "warn" and PLACEHOLDER in c["message"]
               for c in data["checks"])
    # Without --dry-run the missing checkout still stops the run before anything launches.
    res = invoke("run", "--model", "sd15", "--job", "character", "--gpu", "12", "--data", tmp_path / "d",
                 "--out", tmp_path / "r2", "--base", base)
    assert res.exit_code == 2 and "no sd-scripts checkout" in res.output


def test_config_data_refuses_what_run_data_refuses(tmp_path):
    data = _images(tmp_path / "d")
    (data / "3.txt").write_text("")
    for cmd in (["config"], ["run", "--dry-run"]):
        res = invoke(*cmd, "--model", "sdxl", "--job", "character", "--gpu", "24", "--data", data,
                     "--out", tmp_path / cmd[0], "--base", "stabilityai/stable-diffusion-xl-base-1.0")
        assert res.exit_code == 2 and "zero-byte caption" in res.output, (cmd, res.output)


def test_the_dataset_is_judged_at_the_resolution_the_plan_trains_at(tmp_path):
    from kohya_tuner import planning
    from kohya_tuner.families import get_family

    data = _images(tmp_path / "d", size=(400, 400))
    fam = get_family("sdxl")
    at_1024, _ = planning.check_data(data, fam, "character", None, {"resolution": "1024"})
    at_512, _ = planning.check_data(data, fam, "character", None, {"resolution": "512,512"})
    assert at_1024.resolution == 1024 and any(f.code == "tiny" for f in at_1024.findings)
    assert at_512.resolution == 512 and not any(f.code == "tiny" for f in at_512.findings)


@pytest.mark.parametrize("model,side", [("flux", 48), ("sdxl", 20)])
def test_a_side_below_the_bucket_step_fails_dataset_check_and_the_plan(model, side, tmp_path):
    from PIL import Image

    data = _images(tmp_path / "d")
    Image.new("RGB", (side, 400)).save(data / "thin.png")
    res = invoke("dataset", "check", data, "-m", model, "--json")
    found = {f["code"]: f for f in json.loads(res.stdout)["findings"]}
    assert json.loads(res.stdout)["status"] == "fail" and found["too_small"]["severity"] == "fail"
    assert any("thin.png" in f for f in found["too_small"]["files"])
    res = invoke("config", "--model", model, "--job", "character", "--gpu", "24", "--data", data,
                 "--out", tmp_path / "c")
    assert res.exit_code == 2 and "division by zero" in res.output


def test_prep_upscales_a_thin_image_and_leaves_out_one_too_small_saying_so(tmp_path):
    from PIL import Image

    data = _images(tmp_path / "d", n=3, size=(512, 512))
    Image.new("RGB", (40, 300), (9, 9, 9)).save(data / "thin.png")
    Image.new("RGB", (8, 300), (9, 9, 9)).save(data / "sliver.png")
    res = invoke("dataset", "prep", data, "--out", tmp_path / "p", "-m", "sdxl", "--json")
    assert res.exit_code == 0, res.output
    from kohya_tuner.dataset.walk import MANIFEST_NAME

    manifest = json.loads((tmp_path / "p" / MANIFEST_NAME).read_text())
    with Image.open(tmp_path / "p" / manifest["entries"]["thin.png"]["output"]) as im:
        assert min(im.size) >= 64
    assert "sliver.png" in manifest["failed"] and "under 64 px" in manifest["failed"]["sliver.png"]


@pytest.mark.parametrize("job", presets.JOBS)
def test_the_job_length_is_image_passes_and_the_steps_follow_the_effective_batch(job):
    plan = presets.compose("sdxl", job, 12)
    passes = plan.image_passes
    assert passes and plan.provenance["max_train_steps"].layer == "plan"
    eff = plan.config["train_batch_size"] * plan.config["gradient_accumulation_steps"]
    assert plan.config["max_train_steps"] == -(-passes // eff)
    why = plan.provenance["max_train_steps"].why
    assert f"{passes:,} image passes / effective batch {eff}" in why
    assert any(n.startswith(f"Length: {passes:,} image passes") and f"{plan.config['max_train_steps']:,} optimizer "
               "steps" in n for n in plan.notes)
    # More accumulation (a --set here, or the fit) trains the same passes in fewer steps.
    more = presets.compose("sdxl", job, 12, sets=["gradient_accumulation_steps=8"])
    assert more.image_passes == passes and more.config["max_train_steps"] == -(-passes // (eff * 2))


def test_steps_are_derived_after_the_fit_and_per_gpu(tmp_path):
    from kohya_tuner import planning

    plan = presets.compose("sdxl", "style", 24)
    dataset = presets.build_dataset(plan, None)
    planning.fit_plan(plan, dataset, 24, gpus=2, use_history=False)
    b, a = plan.config["train_batch_size"], plan.config.get("gradient_accumulation_steps", 1)
    assert plan.config["max_train_steps"] == -(-plan.image_passes // (b * a * 2))
    assert "x 2 GPUs" in plan.provenance["max_train_steps"].why
    # Save cadence and warmup follow the derived steps.
    steps = plan.config["max_train_steps"]
    assert plan.config["save_every_n_steps"] == presets.save_cadence(steps)
    assert plan.config["lr_warmup_steps"] <= steps // 10


def test_user_steps_win_and_the_note_gives_their_image_passes(tmp_path):
    data = _config(tmp_path, "--model", "sdxl", "--job", "character", "--gpu", "8", "--steps", "1200")
    assert data["config"]["max_train_steps"] == 1200
    b, a = data["config"]["train_batch_size"], data["config"]["gradient_accumulation_steps"]
    assert any(n.startswith("Length: max_train_steps 1,200 (from --steps)") and f"{1200 * b * a:,} image passes" in n
               for n in data["notes"])
    plan = presets.compose("sdxl", "character", 8, sets=["max_train_steps=900"])
    assert plan.config["max_train_steps"] == 900 and plan.image_passes is None
    # sd-scripts takes the length from max_train_epochs when it is given: the note says so.
    plan = presets.compose("sdxl", "character", 8, sets=["max_train_epochs=5"])
    assert [n for n in plan.notes if n.startswith("Length: max_train_epochs 5 (from --set)")]


def test_fit_that_trades_batch_for_accumulation_keeps_the_image_passes(tmp_path):
    from kohya_tuner import planning

    plan = presets.compose("sdxl", "style", 24)  # batch 4, no accumulation
    before = plan.config["max_train_steps"]
    planning.fit_plan(plan, presets.build_dataset(plan, None), 8, use_history=False)
    b, a = plan.config["train_batch_size"], plan.config["gradient_accumulation_steps"]
    assert b * a == 4 and b < 4  # the fit moved batch into accumulation
    assert plan.config["max_train_steps"] == before == -(-plan.image_passes // 4)


def test_style_prompts_without_a_trigger_drop_the_part_that_named_it(tmp_path):
    _config(tmp_path, "--model", "sdxl", "--job", "style", "--gpu", "24")
    lines = [ln.split(" --")[0] for ln in (tmp_path / "out" / "sample_prompts.txt").read_text().splitlines()
             if not ln.startswith("#")]
    assert lines and all(not ln.rstrip().endswith(("style", ",")) and "  " not in ln for ln in lines), lines
    assert presets.fill_trigger("a lighthouse at sunset, {trigger} style", "") == "a lighthouse at sunset"


@pytest.mark.parametrize("model", presets.preset_models())
def test_no_family_preset_draws_a_precision_finding_from_check(model, tmp_path):
    """Every family with a preset, planned for a card given by size alone: the precision it gets is
    one its own script accepts without a warning (bf16-only families keep bf16)."""
    data = _config(tmp_path, "--model", model, "--job", "style", "--gpu", "24")
    res = invoke("check", tmp_path / "out" / "config.toml", "--model", model, "--json")
    found = json.loads(res.stdout)
    precision = [p for p in found["problems"] + found["warnings"]
                 if {"mixed_precision", "full_bf16", "full_fp16"} & set(p["keys"])]
    assert precision == [], precision
    from kohya_tuner.presets import _load_toml, required_precision
    from kohya_tuner.resources import presets_dir

    need = required_precision(_load_toml(presets_dir() / "models" / f"{model}.toml", "Preset"))
    if need:
        assert data["config"]["mixed_precision"] == need[0]
