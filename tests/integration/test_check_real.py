"""The check's rules confirmed on the real pinned sd-scripts (CPU, random-weight SD 1.5).

Each config in tests/data/refused_configs breaks one rule; the real trainer must exit 1
with the message its header quotes, and `kohya-tuner check` must refuse it (exit 2)
naming the same key. The harness config trains (exit 0) and passes the check.

Runs only with the KOHYA_TUNER_REAL_* variables of ../shared/realtrainer/README.md set;
the launches run one after another (the machine is small), each in its own folder.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.clihelp import invoke

pytestmark = pytest.mark.realtrainer

ENV = {k: os.environ.get(f"KOHYA_TUNER_REAL_{k}") for k in ("SDSCRIPTS", "PYTHON", "MODEL", "TOKCACHE", "DATA")}
if not all(ENV.values()):
    pytest.skip("the real trainer is not configured (KOHYA_TUNER_REAL_* unset)", allow_module_level=True)

DATA = Path(__file__).resolve().parent.parent / "data"
REFUSED = sorted((DATA / "refused_configs").glob("*.toml"))


def header(path: Path, field: str) -> str:
    return re.search(rf"^# {field}: (.+)$", path.read_text(), re.M).group(1).strip()


def filled(src: Path, dest_dir: Path) -> Path:
    text = src.read_text()
    for key, value in {"@MODEL@": ENV["MODEL"], "@DATA@": ENV["DATA"], "@TOKCACHE@": ENV["TOKCACHE"],
                       "@OUT@": str(dest_dir / "output")}.items():
        text = text.replace(key, value)
    dest = dest_dir / "config.toml"
    dest.write_text(text)
    return dest


INJECT = Path(__file__).resolve().parents[3] / "shared" / "realtrainer" / "inject"


def launch(cfg: Path, timeout: int = 420) -> subprocess.CompletedProcess:
    accelerate = Path(ENV["PYTHON"]).parent / "accelerate"
    cmd = [str(accelerate), "launch", "--cpu", "--num_processes", "1", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no",
           str(Path(ENV["SDSCRIPTS"]) / "train_network.py"), "--config_file", str(cfg)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE", "PYTHONUNBUFFERED": "1"}
    if INJECT.is_dir():
        env["PYTHONPATH"] = os.pathsep.join([str(INJECT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env["SDS_BACKWARD_LEDGER"] = str(cfg.parent / "backward.ledger")
    return subprocess.run(["nice", "-n", "5", *cmd], cwd=cfg.parent, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("path", REFUSED, ids=lambda p: header(p, "rule"))
def test_the_real_trainer_refuses_what_check_refuses(path, tmp_path):
    cfg = filled(path, tmp_path)
    key, rule, says = header(path, "offending"), header(path, "rule"), header(path, "sd-scripts says")
    res = invoke("check", str(cfg), "--model", "sd15", "--json")
    data = json.loads(res.stdout)
    assert res.exit_code == 2 and any(key in p["keys"] for p in data["problems"]), data
    run = launch(cfg)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-3000:]
    assert says in out, out[-3000:]
    ledger = tmp_path / "backward.ledger"
    if INJECT.is_dir():  # the ledger counts the backward passes really run: none before the refusal
        assert not ledger.exists() or ledger.read_text() == ""


def test_the_harness_config_trains_and_passes_the_check(tmp_path):
    cfg = filled(DATA / "realtrainer_harness.toml", tmp_path)
    assert invoke("check", str(cfg), "--model", "sd15").exit_code == 0
    run = launch(cfg, timeout=900)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert list((tmp_path / "output").glob("probe*.safetensors"))
    if INJECT.is_dir():  # the ledger that proves the refusals ran no step does record real steps
        assert (tmp_path / "backward.ledger").read_text().strip()
