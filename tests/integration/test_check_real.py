"""The check's rules confirmed on the real pinned sd-scripts (CPU, random-weight SD 1.5).

Each config in tests/data/refused_configs breaks one rule; the real trainer must exit 1
with the message its header quotes, and `kohya-tuner check` must refuse it (exit 2)
naming the same key. The harness config trains (exit 0) and passes the check.

Runs only with the KOHYA_TUNER_REAL_* variables of ../shared/realtrainer/README.md set;
the launches run one after another (the machine is small), each in its own folder.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from realtrainer_launch import INJECT, Prelaunched, configured, filled, launch, selected

from tests.clihelp import invoke

pytestmark = pytest.mark.realtrainer

if not configured():
    pytest.skip("the real trainer is not configured (KOHYA_TUNER_REAL_* unset)", allow_module_level=True)

DATA = Path(__file__).resolve().parent.parent / "data"
REFUSED = sorted((DATA / "refused_configs").glob("*.toml"))


def header(path: Path, field: str) -> str:
    return re.search(rf"^# {field}: (.+)$", path.read_text(), re.M).group(1).strip()


@pytest.fixture(scope="module")
def launched(request, tmp_path_factory):
    """Every launch this session runs from this module, started at once and run `workers()` at a time:
    name -> its folder."""
    pool, folders = Prelaunched(), {}
    wanted = selected(request)
    harness_too = any(item.name == "test_the_harness_config_trains_and_passes_the_check"
                      for item in request.session.items)
    for path in [p for p in REFUSED if p.name in wanted] + [DATA / "realtrainer_harness.toml"] * harness_too:
        folders[path.name] = folder = tmp_path_factory.mktemp(path.stem)
        pool.submit(path.name, launch, filled(path, folder), timeout=900, extra_env=pool.env())
    yield pool, folders
    pool.close()


@pytest.mark.parametrize("path", REFUSED, ids=lambda p: header(p, "rule"))
def test_the_real_trainer_refuses_what_check_refuses(path, launched):
    pool, folders = launched
    tmp_path = folders[path.name]
    cfg = tmp_path / "config.toml"
    key, rule, says = header(path, "offending"), header(path, "rule"), header(path, "sd-scripts says")
    res = invoke("check", str(cfg), "--model", "sd15", "--json")
    data = json.loads(res.stdout)
    assert res.exit_code == 2 and any(key in p["keys"] for p in data["problems"]), data
    run = pool.result(path.name)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-3000:]
    assert says in out, out[-3000:]
    ledger = tmp_path / "backward.ledger"
    if INJECT.is_dir():  # the ledger counts the backward passes really run: none before the refusal
        assert not ledger.exists() or ledger.read_text() == ""


def test_the_harness_config_trains_and_passes_the_check(launched):
    pool, folders = launched
    tmp_path = folders["realtrainer_harness.toml"]
    cfg = tmp_path / "config.toml"
    assert invoke("check", str(cfg), "--model", "sd15").exit_code == 0
    run = pool.result("realtrainer_harness.toml")
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert list((tmp_path / "output").glob("probe*.safetensors"))
    if INJECT.is_dir():  # the ledger that proves the refusals ran no step does record real steps
        assert (tmp_path / "backward.ledger").read_text().strip()
