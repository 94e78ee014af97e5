"""One gate: no preset, fit or ladder move produces a config the check refuses."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kohya_tuner import ladder, planning, presets
from kohya_tuner.check import check, gate
from kohya_tuner.errors import UserError
from kohya_tuner.families import FAMILIES
from kohya_tuner.resources import presets_dir

# Families that have presets (others are estimated from user configs only).
PRESET_FAMILIES = sorted(f for f in FAMILIES if (presets_dir() / "models" / f"{f}.toml").is_file()
                         and (presets_dir() / "gpu" / f"{f}.toml").is_file())
PHASES = ("training", "model_load", "cache_latents", "cache_text_encoder", "sampling", "saving")


def composed(family, job, gb):
    plan = presets.compose(family, job, gb)
    return plan, presets.build_dataset(plan, None)


def assert_accepted(cfg, family, ds, what):
    res = check(cfg, FAMILIES[family].script, dataset=ds)
    assert res.ok, (what, [str(p) for p in res.problems])


@pytest.mark.parametrize("family", PRESET_FAMILIES)
@pytest.mark.parametrize("gb", presets.GPU_CLASSES)
def test_every_preset_and_its_fit_pass_the_gate(family, gb):
    for job in presets.JOBS:
        plan, ds = composed(family, job, gb)
        assert_accepted(plan.config, family, ds, f"preset {family}/{job}/{gb}")
        fitted = planning.fit_plan(plan, ds, gb, use_history=False)  # gates internally
        assert fitted.plan.config.get("train_batch_size", 1) >= 1
        assert_accepted({**fitted.plan.config, **fitted.assumed}, family, fitted.dataset, f"fit {family}/{job}/{gb}")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(family=st.sampled_from(PRESET_FAMILIES), job=st.sampled_from(presets.JOBS),
       gb=st.sampled_from(presets.GPU_CLASSES), phases=st.lists(st.sampled_from(PHASES), min_size=1, max_size=6),
       deficit=st.floats(min_value=0.1, max_value=40.0), policy=st.sampled_from(ladder.POLICIES))
def test_every_ladder_move_after_an_oom_passes_the_gate(family, job, gb, phases, deficit, policy):
    plan, ds = composed(family, job, gb)
    cfg, tried = dict(plan.config), []
    for phase in phases:
        step = ladder.next_step(cfg, FAMILIES[family], phase=phase, deficit_gib=deficit, policy=policy,
                                dataset=ds, tried=tried)
        if step is None:
            break
        cfg, ds = ladder.apply_step(cfg, step, copy.deepcopy(ds))
        tried.append(step.move)
        assert_accepted(cfg, family, ds, f"{family}/{job}/{gb} after {tried}")
        assert cfg.get("train_batch_size", 1) >= 1


def test_the_gate_raises_one_user_error_naming_every_problem():
    with pytest.raises(UserError) as exc:
        gate({"train_batch_size": 0, "full_fp16": True}, "train_network.py", what="The config")
    msg = exc.value.message
    assert "train_batch_size" in msg and "full_fp16" in msg and "train_network.py:NetworkTrainer.train" in msg


def test_fit_plan_refuses_a_plan_the_user_made_invalid():
    plan = presets.compose("sd15", "character", 12, sets=["max_data_loader_n_workers=0"])
    plan.set("persistent_data_loader_workers", True, "test")
    with pytest.raises(UserError) as exc:
        planning.fit_plan(plan, presets.build_dataset(plan, None), 12, use_history=False)
    assert "persistent_data_loader_workers" in exc.value.message
