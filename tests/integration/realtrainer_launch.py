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


def launch_argv(argv: list[str], cwd: Path, timeout: int = 420,
                extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run argv as it is (under nice), with the harness's environment, in cwd."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE", "PYTHONUNBUFFERED": "1",
           **(extra_env or {})}
    if INJECT.is_dir():
        env["PYTHONPATH"] = os.pathsep.join([str(INJECT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env["SDS_BACKWARD_LEDGER"] = str(cwd / "backward.ledger")
    return subprocess.run(["nice", "-n", "5", *argv], cwd=cwd, env=env, capture_output=True, text=True, check=False,
                          timeout=timeout)


def launch(cfg: Path, timeout: int = 420, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`accelerate launch --cpu … train_network.py --config_file cfg`, in cfg's folder."""
    cmd = [str(accelerate()), "launch", "--cpu", "--num_processes", "1", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", str(train_script()), "--config_file", str(cfg)]
    return launch_argv(cmd, cfg.parent, timeout, extra_env)


def workers() -> int:
    """How many launches run at once: KOHYA_TUNER_REAL_WORKERS, else 2 where the machine has the cores
    and the memory for two (a launch of the SD 1.5 harness peaks near 5 GiB), else 1.

    A launch spends most of its wall time in one thread (imports, reading the checkpoint, building the
    models), so two at once on two cores finish the suites sooner; each then gets half the cores for
    torch's own threads, so neither oversubscribes them."""
    given = os.environ.get("KOHYA_TUNER_REAL_WORKERS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    try:
        import psutil
        free_gib = psutil.virtual_memory().available / 2**30
    except ImportError:  # psutil is a dependency of the package; without it, stay serial
        return 1
    return 2 if (os.cpu_count() or 1) >= 2 and free_gib >= 14 else 1


class Prelaunched:
    """Launches started ahead of the tests that read them, `workers()` at a time, in submission order.

    A parametrized test submits every case on its first call and then waits only for its own, so the
    suite's order and per-test reports are unchanged while the trainer runs in parallel."""

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor
        self.n = workers()
        self._pool = ThreadPoolExecutor(max_workers=self.n, thread_name_prefix="realtrainer")
        self._jobs: dict[str, object] = {}

    def env(self) -> dict[str, str]:
        if self.n <= 1:
            return {}
        return {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // self.n))}

    def submit(self, key: str, fn, *args, **kwargs) -> None:
        if key not in self._jobs:
            self._jobs[key] = self._pool.submit(fn, *args, **kwargs)

    def result(self, key: str) -> subprocess.CompletedProcess:
        return self._jobs[key].result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def selected(request, param: str = "path") -> set[str]:
    """The file names of `param` among the tests of request's module that this session runs (so `-k`
    launches only what it selects)."""
    names = set()
    for item in request.session.items:
        if getattr(item, "module", None) is request.module and hasattr(item, "callspec"):
            value = item.callspec.params.get(param)
            if isinstance(value, Path):
                names.add(value.name)
    return names
