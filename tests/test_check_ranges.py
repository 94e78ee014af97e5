"""Valid ranges: every numeric argument refuses NaN, +-inf and integers beyond int64, and the
bounds in check/ranges.toml hold exactly at their edges."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kohya_tuner import presets, schema
from kohya_tuner.check import argschema, engine
from kohya_tuner.errors import UserError

SCRIPTS = engine.LORA_SCRIPTS


def numeric_args():
    seen = {}
    for script in SCRIPTS:
        for name, spec in argschema.script_args(script).items():
            if spec.type in ("int", "float", "int_or_float") or spec.item_type == "float":
                seen.setdefault(name, (script, spec))
    return sorted(seen.items())


NUMERIC = numeric_args()


def range_errors(config, script="train_network.py", dataset=None):
    return [p for p in engine.range_problems(config, script, dataset)]


def as_value(spec, v):
    return [v] if spec.type == "list" else v


@pytest.mark.parametrize("name,script,spec", [(n, s, sp) for n, (s, sp) in NUMERIC], ids=[n for n, _ in NUMERIC])
def test_every_numeric_argument_refuses_non_finite_and_huge_values(name, script, spec):
    bad = [float("nan"), float("inf"), -float("inf")] if spec.type != "int" else [2**63, -(2**63) - 1]
    for v in bad:
        found = range_errors({name: as_value(spec, v)}, script)
        assert [p.key for p in found] == [name], (name, v)
        assert found[0].where


def test_the_range_table_names_only_real_arguments():
    known = {n for n, _ in NUMERIC} | set(argschema.raw_schema()["dataset_config"]["keys"])
    assert set(engine.ranges()) <= known | {"resolution"}
    for key, bounds in engine.ranges().items():
        assert bounds.get("where"), key
        assert set(bounds) <= {"min", "max", "gt", "where", "dataset", "below", "above"}, key


def _spec_of(key):
    for script in SCRIPTS:
        spec = argschema.script_args(script).get(key)
        if spec is not None:
            return script, spec
    return None, None


EDGES = [(k, b) for k, b in sorted(engine.ranges().items()) if _spec_of(k)[1] is not None and k != "resolution"]


@pytest.mark.parametrize("key,bounds", EDGES, ids=[k for k, _ in EDGES])
def test_range_edges(key, bounds):
    script, spec = _spec_of(key)
    step = 1 if spec.type == "int" else 0.001
    if spec.type == "int_or_float":
        step = 1

    def ok(v):
        return not [p for p in range_errors({key: as_value(spec, v)}, script) if p.rule == f"range.{key}"]

    if "min" in bounds:
        lo = int(bounds["min"]) if spec.type in ("int", "int_or_float") else float(bounds["min"])
        assert ok(lo) and not ok(lo - step), key
    if "gt" in bounds:
        lo = float(bounds["gt"]) if spec.type != "int" else int(bounds["gt"])
        assert not ok(lo) and ok(lo + step), key
    if "max" in bounds:
        hi = int(bounds["max"]) if spec.type in ("int", "int_or_float") else float(bounds["max"])
        assert ok(hi) and not ok(hi + step), key


def test_resolution_sides_must_be_positive_in_the_config_and_the_dataset_file():
    assert [p.key for p in range_errors({"resolution": "0,512"})] == ["resolution"]
    assert range_errors({"resolution": "512,768"}) == []
    d = {"general": {"resolution": [512, 0]}, "datasets": [{"resolution": -64, "subsets": [{"image_dir": "x"}]}]}
    assert [p.key for p in range_errors({}, dataset=d)] == ["general.resolution", "datasets[0].resolution"]


def test_dataset_file_numbers_have_ranges_at_every_level():
    d = {"general": {"batch_size": 0},
         "datasets": [{"subsets": [{"image_dir": "x", "num_repeats": 0, "caption_dropout_rate": 1.5}]}]}
    keys = [p.key for p in range_errors({}, dataset=d)]
    assert keys == ["general.batch_size", "datasets[0].subsets[0].num_repeats",
                    "datasets[0].subsets[0].caption_dropout_rate"]


@pytest.mark.parametrize("item", ["train_batch_size=0", "network_dim=-4", "network_alpha=nan", "learning_rate=inf",
                                  "gradient_accumulation_steps=0", "max_train_steps=9223372036854775808",
                                  "resolution=0", "network_dropout=1.5", "seed=-1"])
def test_an_explicit_invalid_set_is_refused_not_replaced(item):
    key = item.split("=")[0]
    with pytest.raises(UserError) as exc:
        presets.compose("sd15", "character", 12, sets=[item])
    assert key in exc.value.message


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([n for n, _ in NUMERIC]),
       st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-(2**70), max_value=2**70)))
def test_the_gate_never_accepts_a_non_finite_or_out_of_int64_number(name, value):
    script, spec = dict(NUMERIC)[name]
    cfg = {name: as_value(spec, value)}
    errs = schema.errors_only(schema.validate_config(cfg, script))
    bad = (isinstance(value, float) and not math.isfinite(value)) or (isinstance(value, int) and abs(value) >= 2**63)
    if bad:
        assert name in [p.key for p in errs]


@pytest.mark.parametrize("warmup", [1.1235582092889475e+305, 1.7e308, 0.1])
def test_a_warmup_ratio_whose_step_count_overflows_is_judged_not_crashed_on(warmup):
    # lr_warmup_steps as a float is a ratio of max_train_steps; a ratio so large that the product is no
    # finite number must not end the check with an OverflowError.
    cfg = {"lr_warmup_steps": warmup, "max_train_steps": 1600}
    findings = schema.validate_config(cfg, "train_network.py")
    assert isinstance(findings, list)
