"""What sd-scripts does with --config_file values its dataset schema also reads, and with values it
takes past a range bound: refusals only where the pinned trainer stops, warnings where it goes on.

sd-scripts validates the whole argparse namespace (TOML values and unknown keys included) with its
voluptuous dataset schema before it builds the datasets (library/config_util.py:410). voluptuous
checks types with isinstance: a bool passes for an int, an int never passes for a float.
"""

from __future__ import annotations

import pytest

from kohya_tuner.check import argschema, engine

SD, FT, S3 = "train_network.py", "fine_tune.py", "sd3_train_network.py"
BASE = {"pretrained_model_name_or_path": "m.safetensors", "network_module": "networks.lora", "resolution": "512",
        "network_dim": 8}

# One wrong value per class of the schema's types, and one it takes.
WRONG = {"bool": [1, 0, "true", "false", 1.0], "int": [1.5, "2"], "float": [1, 0, "0.5", True],
         "str": [1, True, 0.5], "table": ["a=b", 1]}
RIGHT = {"bool": [True, False], "int": [2, 0, True], "float": [0.5, 0.0], "str": [".txt"], "table": [{"a": "b"}]}


def _findings(config, script=SD, **kw):
    res = engine.check({**BASE, **config}, script, complete=True, **kw)
    return res, res.problems + res.warnings


def _cases(table):
    for key, accepts in sorted(argschema.namespace_schema(SD).items()):
        if len(accepts) != 1:
            continue
        for value in table[accepts[0]]:
            yield key, value


@pytest.mark.parametrize("key,value", list(_cases(WRONG)), ids=str)
def test_a_value_the_dataset_schema_refuses_is_a_problem(key, value):
    res, found = _findings({key: value})
    mine = [p for p in res.problems if p.rule == "dataset_namespace" and p.key == key]
    assert len(mine) == 1, (key, value, found)
    assert "expected" in mine[0].message and "410" in mine[0].where
    # The schema stops the run before the code could test the value for truth or compute with it.
    assert not {"config_truthy", "type", "config_bool_int"} & {p.rule for p in found if p.key == key}


@pytest.mark.parametrize("key,value", list(_cases(RIGHT)), ids=str)
def test_a_value_the_dataset_schema_takes_is_no_namespace_problem(key, value):
    _, found = _findings({key: value})
    assert not [p for p in found if p.rule == "dataset_namespace"], (key, value, found)


def test_either_type_keys_take_both_and_refuse_the_rest():
    for key in ("prior_loss_weight", "caption_dropout_rate", "token_warmup_step"):
        for ok in (1, 1.0, 0):
            assert not [p for p in _findings({key: ok})[1] if p.rule == "dataset_namespace"], (key, ok)
        assert [p for p in _findings({key: "1"})[0].problems if p.rule == "dataset_namespace"], key


def test_the_refusal_is_on_the_toml_path_only():
    # On a command line argparse has converted the value before the schema sees it.
    res = engine.check({**BASE, "validation_split": 0}, SD, complete=True, origin="command_line")
    assert not [p for p in res.problems + res.warnings if p.rule == "dataset_namespace"]


def test_an_arbitrary_dataset_class_skips_the_schema():
    _, found = _findings({"random_crop": 1, "dataset_class": "mymodule.MyDataset"})
    assert not [p for p in found if p.rule == "dataset_namespace"]
    assert [p.rule for p in found if p.key == "random_crop"] == ["config_truthy"]


def test_fine_tune_has_no_dreambooth_keys_in_its_schema():
    assert "class_tokens" in argschema.namespace_schema(SD)
    assert "class_tokens" not in argschema.namespace_schema(FT)
    assert "random_crop" in argschema.namespace_schema(FT)


def test_resolution_and_face_crop_are_judged_by_their_own_rules():
    schema = argschema.namespace_schema(SD)
    assert "resolution" not in schema and "face_crop_aug_range" not in schema
    assert engine.check({**BASE, "resolution": "512,768"}, SD, complete=True).ok


def test_an_unknown_key_the_datasets_read_is_a_default_not_ignored():
    for key, value in (("network_multiplier", 0.5), ("caption_prefix", "ohwx, "), ("validation_seed", 3)):
        if key in argschema.script_args(SD):
            continue
        _, found = _findings({key: value})
        rules = [p.rule for p in found if p.key == key]
        assert rules == ["dataset_default"], (key, found)
    # batch_size and num_repeats share their dataset key with an argument of another name.
    assert [p.rule for p in _findings({"batch_size": 2})[1] if p.key == "batch_size"] == ["unknown_key"]
    # A key no dataset reads is still unknown.
    assert [p.rule for p in _findings({"netwrok_dim": 8})[1] if p.key == "netwrok_dim"] == ["unknown_key"]


def test_an_unknown_key_of_the_wrong_type_is_refused():
    res, found = _findings({"network_multiplier": 1})
    assert [p.rule for p in found if p.key == "network_multiplier"] == ["dataset_namespace"]
    assert not res.ok


def test_a_bool_for_an_integer_is_computed_as_one_or_zero():
    for key in ("keep_tokens", "max_train_epochs", "save_every_n_epochs"):
        res, found = _findings({key: True})
        assert not [p for p in res.problems if p.key == key], (key, res.problems)
        assert "config_bool_int" in [p.rule for p in res.warnings if p.key == key], key
    # On a command line argparse's int() refuses it.
    res = engine.check({**BASE, "keep_tokens": True}, SD, complete=True, origin="command_line")
    assert [p.rule for p in res.problems if p.key == "keep_tokens"] == ["type"]


def test_the_dataset_file_takes_a_bool_where_it_wants_an_int():
    dataset = {"datasets": [{"resolution": 512, "subsets": [{"image_dir": "img", "num_repeats": True,
                                                             "keep_tokens": False}]}]}
    res = engine.check(BASE, SD, dataset=dataset, complete=True)
    assert not [p for p in res.problems if p.rule == "dataset_schema"], res.problems
    bad = {"datasets": [{"resolution": 512, "subsets": [{"image_dir": "img", "num_repeats": 1.5}]}]}
    assert [p for p in engine.check(BASE, SD, dataset=bad, complete=True).problems if p.rule == "dataset_schema"]


# ---- ranges with a side sd-scripts goes on past ---------------------------------------------

@pytest.mark.parametrize("reps", [0, -1])
def test_a_subset_below_one_repeat_is_skipped_not_refused(reps):
    dataset = {"datasets": [{"resolution": 512, "subsets": [{"image_dir": "img"},
                                                             {"image_dir": "reg", "is_reg": True, "num_repeats": reps}]}]}
    res = engine.check(BASE, SD, dataset=dataset, complete=True)
    assert res.ok, res.problems
    [w] = [p for p in res.warnings if p.rule == "range.num_repeats"]
    assert "skips" in w.message and w.key == "datasets[0].subsets[1].num_repeats"


def test_too_many_repeats_are_still_refused():
    dataset = {"datasets": [{"resolution": 512, "subsets": [{"image_dir": "img", "num_repeats": 10**9}]}]}
    assert [p for p in engine.check(BASE, SD, dataset=dataset, complete=True).problems
            if p.rule == "range.num_repeats"]


@pytest.mark.parametrize("split,word", [(-0.5, "every image"), (1.5, "drops")])
def test_a_validation_split_outside_zero_one_is_a_warning(split, word):
    res, _ = _findings({"validation_split": split})
    assert res.ok, res.problems
    [w] = [p for p in res.warnings if p.rule == "range.validation_split"]
    assert word in w.message


def _tree(tmp_path):
    img = tmp_path / "img" / "2_ohwx"
    img.mkdir(parents=True)
    (img / "a.png").write_bytes(b"\x89PNG")
    (tmp_path / "m.safetensors").write_bytes(b"0")
    return {**BASE, "pretrained_model_name_or_path": str(tmp_path / "m.safetensors"),
            "train_data_dir": str(tmp_path / "img")}


@pytest.mark.parametrize("split,empty", [(0.5, False), (1.0, True), (1.5, False), (2.0, True), (3.0, True)])
def test_a_validation_split_that_keeps_no_training_image(tmp_path, split, empty):
    res = engine.check({**_tree(tmp_path), "validation_split": split}, SD, complete=True, filesystem=True)
    assert ("no_training_images" in [p.rule for p in res.problems]) == empty, res.problems


def test_a_vae_hub_id_is_downloaded_for_sd_and_sdxl_but_a_file_elsewhere(tmp_path):
    base = _tree(tmp_path)
    hub = "stabilityai/sd-vae-ft-mse"
    for script in (SD, "sdxl_train_network.py"):
        res = engine.check({**base, "vae": hub}, script, complete=True, filesystem=True)
        assert "vae_missing" not in [p.rule for p in res.problems], script
    res = engine.check({**base, "vae": str(tmp_path / "vae.safetensors")}, SD, complete=True, filesystem=True)
    assert "vae_missing" in [p.rule for p in res.problems]
    res = engine.check({**base, "network_module": "networks.lora_sd3", "vae": hub}, S3, complete=True,
                       filesystem=True)
    assert "vae_missing" in [p.rule for p in res.problems]


# ---- values a rule used to refuse though sd-scripts never reads them --------------------------

def test_conv_alpha_without_conv_dim_is_never_read():
    for args, refused in ((["conv_alpha=x"], False), (["conv_dim=4", "conv_alpha=x"], True)):
        res = engine.check({**BASE, "network_args": args}, SD, complete=True)
        assert ("lora_network_args_numbers" in [p.rule for p in res.problems]) == refused, args


def test_augmentation_on_a_subset_sd_scripts_skips_does_not_stop_latent_caching(tmp_path):
    base = {**_tree(tmp_path), "cache_latents": True}
    base.pop("train_data_dir")
    img = str(tmp_path / "img" / "2_ohwx")
    for extra, refused in (({"image_dir": str(tmp_path / "gone"), "random_crop": True}, False),
                           ({"image_dir": img, "num_repeats": 0, "color_aug": True}, False),
                           ({"image_dir": img, "random_crop": True}, True)):
        dataset = {"datasets": [{"resolution": 512, "subsets": [{"image_dir": img}, extra]}]}
        res = engine.check(base, SD, dataset=dataset, complete=True, filesystem=True)
        assert ("cache_latents_with_augmentation" in [p.rule for p in res.problems]) == refused, extra
