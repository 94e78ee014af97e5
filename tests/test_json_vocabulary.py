"""The JSON every command prints speaks one vocabulary (docs/json.md)."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest

from tests.clihelp import invoke

GPU_KEYS = {"gb", "name", "others_gib", "budget_gib", "fits", "described"}


@pytest.fixture(scope="module")
def config_json(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("cfg") / "run"
    res = invoke("config", "--model", "sdxl", "--job", "style", "--gpu", "12", "--out", out, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.mark.parametrize("argv", [
    ["config", "--model", "nope", "--job", "style", "--gpu", "12", "--out", "{tmp}/o"],
    ["config", "--job", "style", "--gpu", "12", "--out", "{tmp}/o"],
    ["estimate", "{tmp}/missing.toml"],
    ["fit", "{tmp}/missing.toml", "--gpu", "8", "--out", "{tmp}/f.toml"],
    ["check", "{tmp}/missing.toml"],
    ["diagnose", "{tmp}/missing.log"],
    ["dataset", "check", "{tmp}/none", "--model", "sd15"],
    ["doctor", "--python", "{tmp}/no-python"],
    ["run", "--continue", "{tmp}/nothing"],
])
def test_every_error_is_the_error_object_on_stdout(argv, tmp_path):
    res = invoke(*[a.replace("{tmp}", str(tmp_path)) for a in argv], "--json")
    assert res.exit_code == 2, res.output
    data = json.loads(res.stdout)
    assert list(data) == ["error"] and set(data["error"]) == {"message", "hint"}
    assert data["error"]["message"]


def test_config_speaks_the_shared_keys(config_json):
    d = config_json
    assert set(d["gpu"]) == GPU_KEYS and d["gpu"]["gb"] == 12
    assert isinstance(d["fits"], bool) and d["fits"] == d["gpu"]["fits"]
    assert all(isinstance(a, str) for a in d["assumptions"]) and isinstance(d["cautions"], list)
    assert "assumed" not in d and "fit_message" not in d
    for st in d["steps"]:
        assert {"move", "changes", "saved_gib", "resume_safe", "reason"} <= set(st)


def test_estimate_and_fit_share_gpu_fits_and_assumptions(config_json, tmp_path):
    cfg = config_json["files"]["config.toml"]
    est = json.loads(invoke("estimate", cfg, "--gpu", "8", "--json").stdout)
    assert set(est["gpu"]) == GPU_KEYS
    assert "fits" not in est and set(est["fits_cards"]) >= {"6", "8", "24"}
    assert all(isinstance(v, bool) for v in est["fits_cards"].values())
    res = invoke("fit", cfg, "--gpu", "8", "--out", tmp_path / "fit.toml", "--json")
    fit = json.loads(res.stdout)
    assert set(fit["gpu"]) == GPU_KEYS and isinstance(fit["fits"], bool) and fit["fits"] == fit["gpu"]["fits"]
    assert set(fit["input"]) == set(est["input"]) == {"path", "format", "script", "notes"}
    for d in (est, fit):
        assert all(isinstance(a, str) for a in d["assumptions"]) and isinstance(d["cautions"], list)


def test_outcome_sets_agree_and_host_ram_is_cpu_oom(tmp_path):
    from kohya_tuner.logparse.result import Outcome
    from kohya_tuner.run.journal import OUTCOMES

    assert set(typing.get_args(Outcome)) <= set(OUTCOMES)
    log = tmp_path / "killed.log"
    log.write_text("steps:  10%|█         | 10/100 [00:10<01:30,  1.00it/s, avr_loss=0.1]\n", encoding="utf-8")
    d = json.loads(invoke("diagnose", log, "--exit-code", "137", "--json").stdout)
    assert (d["outcome"], d["error"]["kind"]) == ("cpu_oom", "cpu_oom")
    log.write_text("RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough "
                   "memory: you tried to allocate 1073741824 bytes.\n", encoding="utf-8")
    assert json.loads(invoke("diagnose", log, "--json").stdout)["outcome"] == "cpu_oom"


def test_docs_name_every_outcome():
    from kohya_tuner.run.journal import OUTCOMES

    text = (Path(__file__).resolve().parent.parent / "docs" / "json.md").read_text(encoding="utf-8")
    for value in OUTCOMES:
        assert f"| `{value}` |" in text
