"""The check's rules confirmed on the real pinned sd-scripts (CPU, random-weight SD 1.5).

Each config in tests/data/refused_configs breaks one rule; the real trainer must exit 1
with the message its header quotes, and `kohya-tuner check` must refuse it (exit 2)
naming the same key. The harness config trains (exit 0) and passes the check.

The configs in `sdxl/` and `flux/` are for sdxl_train_network.py and flux_train_network.py and
each breaks one of their start-up rules, most before the model loads (the trainer never logs
"preparing accelerator", train_network.py:593, which follows assert_extra_args). The SDXL ones
run on the random-weight SDXL (skipped without it); the FLUX ones on flux_standin(), whose
model file holds only the key names the trainer reads first: the stand-in control below shows
that the trainer passes its start-up rules with it and fails only when it loads the weights.
A config headed `# needs: model` breaks a rule checked after the weights load (a FLUX one then
runs on the random-weight FLUX.1, skipped without it).

Runs only with the KOHYA_TUNER_REAL_* variables of ../shared/realtrainer/README.md set;
the launches start ahead of the tests that read them, two at a time where the machine has the cores
and the memory (realtrainer_launch.Prelaunched, one pool for the session), each in its own folder.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from realtrainer_launch import (
    FAMILIES,
    INJECT,
    PEAK_GIB,
    configured,
    family_missing,
    family_of,
    filled,
    launch,
)

from tests.clihelp import invoke

pytestmark = pytest.mark.realtrainer

if not configured():
    pytest.skip("the real trainer is not configured (KOHYA_TUNER_REAL_* unset)", allow_module_level=True)

DATA = Path(__file__).resolve().parent.parent / "data"
REFUSED = sorted((DATA / "refused_configs").glob("*.toml"))
FAMILY_REFUSED = sorted((DATA / "refused_configs").glob("*/*.toml"))
# Logged by train_network.py:593 right after assert_extra_args, before the model loads.
PAST_START_UP = "preparing accelerator"


def header(path: Path, field: str) -> str:
    return re.search(rf"^# {field}: (.+)$", path.read_text(), re.M).group(1).strip()


def _late(path: Path) -> bool:
    """`# needs: model`: refused once the weights are loaded. A FLUX refusal before that runs on the stand-in."""
    return bool(re.search(r"^# needs: model$", path.read_text(), re.M))


def prelaunch(pool, cases, tmp_path_factory) -> dict[tuple[str, str], Path]:
    """Submits every launch this session runs from this module (conftest's `prelaunched`, in test
    order): (test, config name) -> its folder; a test reads its result by the same key."""
    folders = {}
    for test, path in cases:
        script, gib, standin = "train_network.py", PEAK_GIB["sd15"], False
        if test == "test_the_real_family_script_refuses_what_check_refuses":
            name = family_of(path)
            late = _late(path)
            standin = name == "flux" and not late
            if not standin and family_missing(name):
                continue  # the test skips itself
            # A refusal before the weights are read holds little memory: it need not run alone as a load would.
            script, gib = FAMILIES[name].script, PEAK_GIB[name if late else "standin"]
        elif test == "test_the_flux_standin_passes_the_start_up_rules_and_fails_only_at_the_weights":
            path, script, gib, standin = DATA / "accepted_configs" / "flux" / "harness.toml", \
                "flux_train_network.py", PEAK_GIB["standin"], True
        if path is None:
            continue
        key = (test, path.name)
        folders[key] = folder = tmp_path_factory.mktemp(path.stem)
        pool.submit(key, gib, launch, filled(path, folder, standin=standin), timeout=900, script=script)
    return folders


@pytest.fixture(scope="module")
def launched(prelaunched):
    """(the queue the launches run in, (test, config name) -> its folder)."""
    return prelaunched[__name__]


@pytest.mark.parametrize("path", REFUSED, ids=lambda p: header(p, "rule"))
def test_the_real_trainer_refuses_what_check_refuses(path, launched):
    pool, folders = launched
    job = ("test_the_real_trainer_refuses_what_check_refuses", path.name)
    tmp_path = folders[job]
    cfg = tmp_path / "config.toml"
    key, rule, says = header(path, "offending"), header(path, "rule"), header(path, "sd-scripts says")
    res = invoke("check", str(cfg), "--model", "sd15", "--json")
    data = json.loads(res.stdout)
    assert res.exit_code == 2 and any(key in p["keys"] for p in data["problems"]), data
    run = pool.result(job)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-3000:]
    assert says in out, out[-3000:]
    ledger = tmp_path / "backward.ledger"
    if INJECT.is_dir():  # the ledger counts the backward passes really run: none before the refusal
        assert not ledger.exists() or ledger.read_text() == ""


@pytest.mark.parametrize("path", FAMILY_REFUSED, ids=lambda p: f"{p.parent.name}-{p.stem}")
def test_the_real_family_script_refuses_what_check_refuses(path, launched):
    name = family_of(path)
    family = FAMILIES[name]
    late = _late(path)
    standin = name == "flux" and not late
    if not standin and family_missing(name):
        pytest.skip(f"no random-weight {family.model} ({', '.join(family_missing(name))} unset)")
    pool, folders = launched
    job = ("test_the_real_family_script_refuses_what_check_refuses", path.name)
    tmp_path = folders[job]
    cfg = tmp_path / "config.toml"
    key, says = header(path, "offending"), header(path, "sd-scripts says")
    res = invoke("check", str(cfg), "--model", family.model, "--json")
    data = json.loads(res.stdout)
    assert res.exit_code == 2 and any(key in p["keys"] for p in data["problems"]), data
    run = pool.result(job)
    out = run.stdout + run.stderr
    assert run.returncode == 1 and says in out, out[-3000:]
    assert (PAST_START_UP in out) == late, out[-3000:]
    ledger = tmp_path / "backward.ledger"
    if INJECT.is_dir():
        assert not ledger.exists() or ledger.read_text() == ""


def test_the_flux_standin_passes_the_start_up_rules_and_fails_only_at_the_weights(launched):
    """The control for the FLUX refusals: the FLUX harness config (accepted_configs/flux/harness.toml,
    what the refused ones vary), on the same stand-in, passes the check and the trainer's start-up
    rules, and stops only where it loads the transformer's weights."""
    pool, folders = launched
    job = ("test_the_flux_standin_passes_the_start_up_rules_and_fails_only_at_the_weights", "harness.toml")
    cfg = folders[job] / "config.toml"
    res = invoke("check", str(cfg), "--model", "flux", "--json")
    assert res.exit_code == 0, res.stdout
    run = pool.result(job)
    out = run.stdout + run.stderr
    assert run.returncode == 1 and PAST_START_UP in out, out[-3000:]
    assert "Error(s) in loading state_dict for Flux" in out, out[-3000:]
