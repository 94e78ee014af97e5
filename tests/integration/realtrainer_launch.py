"""Filling a test config's @NAME@ placeholders and launching the real pinned sd-scripts on the CPU.

Shared by test_check_real.py (configs the trainer refuses) and test_accepted_real.py (configs it
trains). The variables are those ../shared/realtrainer/build.sh prints; `configured()` says
whether they are all set.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ENV = {k: os.environ.get(f"KOHYA_TUNER_REAL_{k}") for k in ("SDSCRIPTS", "PYTHON", "MODEL", "TOKCACHE", "DATA")}
INJECT = Path(__file__).resolve().parents[3] / "shared" / "realtrainer" / "inject"


def configured() -> bool:
    return all(ENV.values())


def fill(text: str, out_dir: Path, config_dir: Path | None = None) -> str:
    """The text with @MODEL@, @DATA@, @TOKCACHE@, @OUT@ (out_dir/output) and @CONFIGDIR@ filled in."""
    values = {"@MODEL@": ENV["MODEL"], "@DATA@": ENV["DATA"], "@TOKCACHE@": ENV["TOKCACHE"],
              "@OUT@": str(out_dir / "output")}
    if config_dir is not None:
        values["@CONFIGDIR@"] = str(config_dir)
    for key, value in values.items():
        text = text.replace(key, value)
    return text


def filled(src: Path, dest_dir: Path, name: str = "config.toml") -> Path:
    dest = dest_dir / name
    dest.write_text(fill(src.read_text(), dest_dir, src.parent))
    return dest


def accelerate() -> Path:
    return Path(ENV["PYTHON"]).parent / "accelerate"


def train_script() -> Path:
    return Path(ENV["SDSCRIPTS"]) / "train_network.py"


def launch_argv(argv: list[str], cwd: Path, timeout: int = 420) -> subprocess.CompletedProcess:
    """Run argv as it is (under nice), with the harness's environment, in cwd."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE", "PYTHONUNBUFFERED": "1"}
    if INJECT.is_dir():
        env["PYTHONPATH"] = os.pathsep.join([str(INJECT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env["SDS_BACKWARD_LEDGER"] = str(cwd / "backward.ledger")
    return subprocess.run(["nice", "-n", "5", *argv], cwd=cwd, env=env, capture_output=True, text=True, check=False,
                          timeout=timeout)


def launch(cfg: Path, timeout: int = 420) -> subprocess.CompletedProcess:
    """`accelerate launch --cpu … train_network.py --config_file cfg`, in cfg's folder."""
    cmd = [str(accelerate()), "launch", "--cpu", "--num_processes", "1", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", str(train_script()), "--config_file", str(cfg)]
    return launch_argv(cmd, cfg.parent, timeout)
