from __future__ import annotations

from pathlib import Path

import pytest
import toml

from kohya_tuner import config_io, planfiles, presets, schema
from kohya_tuner.errors import UserError
from kohya_tuner.families import FAMILIES
from kohya_tuner.gpu import choose, parse_gb
from kohya_tuner.resources import presets_dir


@pytest.mark.parametrize("model", presets.preset_models())
@pytest.mark.parametrize("job", presets.JOBS)
@pytest.mark.parametrize("gb", presets.GPU_CLASSES)
def test_every_composed_preset_validates_and_round_trips(model, job, gb, tmp_path):
    plan = presets.compose(model, job, gb, inputs={"output_dir": str(tmp_path / "o"), "output_name": "x"})
    dataset = presets.build_dataset(plan, tmp_path / "imgs", trigger="ohwx")
    assert schema.errors_only(presets.validate_plan(plan, dataset)) == []
    assert schema.validate_dataset(dataset, plan.family) == []
    files = planfiles.render(plan, dataset, tmp_path)
    assert config_io.flatten(toml.loads(files.texts["config.toml"])) == plan.config
    assert toml.loads(files.texts["dataset.toml"]) == dataset
    assert plan.config["save_state"] is True and plan.config["save_every_n_steps"] >= 1
    assert "mixed_precision" in plan.config and "split_mode" not in plan.config
    if model == "flux":
        assert plan.config["network_train_unet_only"] is True
        if gb < 24:
            assert plan.config["fp8_base"] is True


def test_layers_compose_in_order_and_keep_provenance(tmp_path):
    user = tmp_path / "mine.toml"
    user.write_text("[settings]\nnetwork_dim = 24\nlearning_rate = 2e-4\n[why]\nnetwork_dim = 'my taste'\n")
    plan = presets.compose("sdxl", "style", 12, preset_file=user, sets=["learning_rate=3e-4"])
    assert plan.config["network_dim"] == 24
    assert plan.provenance["network_dim"].layer == "preset:mine.toml"
    assert plan.provenance["network_dim"].why == "my taste"
    assert plan.config["learning_rate"] == 3e-4 and plan.provenance["learning_rate"].layer == "--set"
    assert plan.provenance["network_module"].layer == "model:sdxl"
    assert plan.provenance["train_batch_size"].layer == "gpu:12GB"


def test_guide_starting_values():
    # Rank and alpha come from the job on every class (docs/presets.md has the estimates behind it).
    sd6 = presets.compose("sd15", "character", 6).config
    assert (sd6["network_dim"], sd6["network_alpha"], sd6["resolution"], sd6["train_batch_size"],
            sd6["gradient_accumulation_steps"], sd6["mixed_precision"], sd6["gradient_checkpointing"],
            sd6["learning_rate"]) == (16, 8.0, "512", 1, 4, "fp16", True, 1e-4)
    f24 = presets.compose("flux", "style", 24, bf16=True).config
    assert (f24["resolution"], f24["train_batch_size"], f24["gradient_accumulation_steps"], f24["mixed_precision"],
            f24["optimizer_type"], f24["learning_rate"]) == ("512", 1, 4, "bf16", "AdamW8bit", 1e-4)
    assert f24["network_alpha"] in (f24["network_dim"], f24["network_dim"] / 2)
    assert [presets.compose("flux", "style", g).config["blocks_to_swap"] for g in (12, 10, 8)] == [16, 22, 28]
    # The job's length is image passes within the batch-1 recipes' range; the steps follow the batch.
    for job, (lo, hi) in (("character", (1000, 2000)), ("style", (2000, 4000))):
        plan = presets.compose("sdxl", job, 12)
        eff = plan.config["train_batch_size"] * plan.config["gradient_accumulation_steps"]
        assert lo <= plan.image_passes <= hi
        assert plan.config["max_train_steps"] == -(-plan.image_passes // eff)


def test_gpu_class_is_the_largest_not_above():
    assert presets.gpu_class_for(11) == 10 and presets.gpu_class_for(24) == 24 and presets.gpu_class_for(4) == 6
    assert presets.gpu_class_for(200) == 80


@pytest.mark.parametrize("text", ["3", "twelve", "12.5", "-8", ""])
def test_bad_gpu_values(text):
    with pytest.raises(UserError):
        parse_gb(text)


def test_gpu_auto_without_nvidia_is_a_user_error(monkeypatch):
    from kohya_tuner import gpu

    monkeypatch.setattr(gpu, "list_gpus", lambda: [])
    with pytest.raises(UserError, match="--gpu 12"):
        choose("auto")


def test_no_bf16_card_switches_to_fp16():
    plan = presets.compose("sdxl", "style", 12, bf16=False)
    assert plan.config["mixed_precision"] == "fp16" and plan.config["no_half_vae"] is True
    assert plan.provenance["mixed_precision"].layer == "gpu:detected"


@pytest.mark.parametrize("item,match", [
    ("network_dimm=8", "network_dim"), ("network_dim=eight", "integer"), ("nokey", "key=value"),
    ("mixed_precision=fp32", "mixed_precision"),
])
def test_bad_set_values(item, match):
    with pytest.raises(UserError, match=match):
        presets.compose("sd15", "style", 8, sets=[item])


def test_a_set_that_needs_another_key_is_judged_with_the_other_sets():
    """`--set mixed_precision=bf16 --set full_bf16=true` is what sd-scripts accepts: each --set is
    not judged alone against defaults (mixed_precision "no"), which would refuse it."""
    plan = presets.compose("sdxl", "style", 12, sets=["mixed_precision=bf16", "full_bf16=true"])
    assert plan.config["full_bf16"] is True and plan.config["mixed_precision"] == "bf16"
    assert not [p for p in presets.validate_plan(plan, None) if p.severity == "error"]


def test_set_values_are_conformed_to_sd_scripts_types():
    plan = presets.compose("sdxl", "style", 12, sets=["resolution=768", "network_alpha=8", 'network_args=["conv_dim=4"]'])
    assert plan.config["resolution"] == "768" and plan.config["network_alpha"] == 8.0
    assert plan.config["network_args"] == ["conv_dim=4"]


def test_malformed_preset_says_line_and_column(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[settings]\nnetwork_dim = = 4\n")
    with pytest.raises(UserError, match="line 2"):
        presets.compose("sd15", "style", 8, preset_file=bad)


def test_unknown_model_and_job(monkeypatch):
    with pytest.raises(UserError, match="sd15, sdxl, flux"):
        presets.compose("sd9", "style", 8)
    monkeypatch.setattr(presets, "preset_models", lambda: ("flux", "sd15"))
    with pytest.raises(UserError, match="no presets for the model family Stable Diffusion XL.*flux, sd15"):
        presets.compose("sdxl", "style", 8)
    monkeypatch.undo()
    with pytest.raises(UserError, match="style"):
        presets.compose("sdxl", "styel", 8)


def test_schnell_variant():
    plan = presets.compose("flux", "style", 24, variant="schnell")
    assert plan.config["t5xxl_max_token_length"] == 256 and plan.variant == "schnell"
    with pytest.raises(UserError):
        presets.compose("sdxl", "style", 24, variant="schnell")


@pytest.mark.parametrize("steps,cadence", [(100, 10), (1500, 150), (3000, 300), (20, 2), (1, 1)])
def test_save_cadence_scales_with_the_run(steps, cadence):
    assert presets.save_cadence(steps) == cadence


def _images(folder, n, size=(640, 768)):
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.new("RGB", size, (i * 7 % 255, 80, 120)).save(folder / f"img {i}.png")
        (folder / f"img {i}.txt").write_text("ohwx, a photo")


def test_dataset_repeats_follow_image_count_and_job(tmp_path):
    from kohya_tuner import dataset as ds_mod

    _images(tmp_path / "few", 10)
    _images(tmp_path / "many", 40)
    plan = presets.compose("sdxl", "character", 12)
    few = presets.build_dataset(plan, tmp_path / "few", trigger="ohwx")["datasets"][0]["subsets"][0]
    many = presets.build_dataset(plan, tmp_path / "many")["datasets"][0]["subsets"][0]
    # Repeats cut the job's image passes into its epochs, whatever the batch.
    assert few["num_repeats"] == ds_mod.suggest_repeats(10, "character", plan.image_passes, 1)
    assert few["num_repeats"] > many["num_repeats"] >= 1
    assert few["class_tokens"] == "ohwx" and "class_tokens" not in many


def test_kohya_ss_folder_layout_becomes_one_subset_per_folder(tmp_path):
    _images(tmp_path / "img" / "10_ohwx woman", 3)
    _images(tmp_path / "img" / "4_style", 2)
    plan = presets.compose("sd15", "character", 8)
    subsets = presets.build_dataset(plan, tmp_path / "img")["datasets"][0]["subsets"]
    got = sorted((s["image_dir"].rsplit("/", 1)[-1], s["num_repeats"], s["class_tokens"]) for s in subsets)
    assert got == [("10_ohwx woman", 10, "ohwx woman"), ("4_style", 4, "style")]
    assert schema.validate_dataset({"datasets": [{"subsets": subsets}]}) == []


def test_dataset_points_at_the_prepared_copy(tmp_path):
    from kohya_tuner import dataset as ds_mod

    src = tmp_path / "photos"
    _images(src, 3, size=(2400, 3000))
    plan = presets.compose("sdxl", "character", 12)
    before = presets.build_dataset(plan, src)["datasets"][0]["subsets"][0]["image_dir"]
    assert before == str(src.absolute())
    result = ds_mod.prepare(src, tmp_path / "photos.prepared", plan.family, workers=1)
    after = presets.build_dataset(plan, src)["datasets"][0]["subsets"][0]["image_dir"]
    assert after == str(Path(result.out).absolute())
    assert after != before


def test_gpu_tables_leave_rank_and_precision_to_the_job_and_the_card():
    """Rank comes from the job (the fit lowers it when the estimate demands it) and precision
    from the card's architecture; a GPU table that set either would undo both."""
    import tomllib

    from kohya_tuner.resources import presets_dir

    for path in sorted((presets_dir() / "gpu").glob("*.toml")):
        doc = tomllib.loads(path.read_text())
        for cls, table in doc.items():
            settings = table.get("settings", {})
            assert not {"network_dim", "network_alpha", "mixed_precision", "no_half_vae"} & set(settings), (path, cls)
            assert set(table.get("why", {})) <= set(settings), (path, cls)  # no reason left for a removed value


def test_job_sample_prompts_name_the_trigger():
    for job in presets.JOBS:
        plan = presets.compose("sd15", job, 12, bf16=True)
        assert plan.sample_prompts and all("{trigger}" in p for p in plan.sample_prompts)


@pytest.mark.parametrize("family", sorted(f for f in FAMILIES if (presets_dir() / "models" / f"{f}.toml").is_file()))
def test_a_resolution_set_below_the_presets_smallest_bucket_takes_the_bucket_with_it(family):
    from kohya_tuner.check import check

    plan = presets.compose(family, "style", 12, sets=["resolution=448,448"])
    assert plan.config["resolution"] == "448,448"
    low = plan.config.get("min_bucket_reso")
    assert low is None or low <= 448
    res = check(plan.config, FAMILIES[family].script, dataset=presets.build_dataset(plan, None), family=family)
    assert not [p for p in res.problems if "min_bucket_reso" in p.keys], res.problems
    # The user's own bound is theirs: check names the clash instead.
    mine = presets.compose(family, "style", 12, sets=["resolution=448,448", "min_bucket_reso=512"])
    assert mine.config["min_bucket_reso"] == 512
