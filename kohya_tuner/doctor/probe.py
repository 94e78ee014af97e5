"""Run the probe script in the trainer's Python and read what it found."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kohya_tuner.child import run_bounded
from kohya_tuner.doctor.probe_script import PROBE_MARK, PROBE_SOURCE

DEFAULT_TIMEOUT = 60.0


@dataclass
class PythonProbe:
    """What a Python environment holds for training. Fields are None when the thing is
    absent; `errors` has a one-line reason for each part that is present but broken;
    `error` is set when the interpreter itself could not be run or answered nonsense."""

    python: str
    ran: bool = False
    error: str | None = None
    elapsed_s: float = 0.0
    python_version: str | None = None
    executable: str | None = None
    platform: str | None = None
    torch: str | None = None
    torch_cuda: str | None = None
    torch_hip: str | None = None
    cuda_available: bool = False
    devices: list[dict[str, Any]] = field(default_factory=list)
    arch_list: list[str] = field(default_factory=list)
    bf16: bool | None = None
    accelerate: str | None = None
    accelerate_config_path: str | None = None
    accelerate_config: dict[str, Any] | None = None
    xformers: str | None = None
    xformers_cpp: bool | None = None
    xformers_built_for: dict[str, Any] | None = None
    xformers_ran: bool = False
    bitsandbytes: str | None = None
    bitsandbytes_ran: bool = False
    packages: dict[str, str | None] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_output(cls, python: str, data: dict[str, Any], elapsed: float) -> "PythonProbe":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known.pop("python", None)
        probe = cls(python=python, ran=True, **known)
        probe.elapsed_s = round(elapsed, 3)
        return probe


def probe_python(python: str | None = None, *, timeout: float = DEFAULT_TIMEOUT, packages: list[str] | None = None,
                 test_kernels: bool = True) -> PythonProbe:
    """Look at torch, accelerate, xformers and bitsandbytes as `python` (default: this
    interpreter) sees them, in a child process. Never raises: a missing, crashing or
    hanging interpreter comes back as a probe with `error` set."""
    exe = python or sys.executable
    opts = json.dumps({"packages": list(packages or []), "test_kernels": test_kernels})
    env = dict(os.environ)
    env["PYTHONIOENCODING"] = "utf-8"
    env.pop("PYTHONSTARTUP", None)
    t0 = time.monotonic()
    # An empty working folder, so a stray torch/ or xformers/ folder where doctor was
    # started cannot shadow the installed package.
    with tempfile.TemporaryDirectory(prefix="kt-probe-") as cwd:
        try:
            proc = run_bounded([exe, "-c", PROBE_SOURCE, opts], cwd=cwd, env=env, timeout_s=timeout)
        except FileNotFoundError:
            return PythonProbe(python=exe, error=f"{exe} does not exist")
        except PermissionError:
            return PythonProbe(python=exe, error=f"{exe} is not executable")
        except subprocess.TimeoutExpired:
            return PythonProbe(python=exe, error=f"{exe} did not answer within {timeout:g} s (a hung CUDA or "
                                                 "driver call, or a very slow disk)", elapsed_s=timeout)
        except OSError as exc:
            return PythonProbe(python=exe, error=f"{exe} cannot be run: {exc.strerror or exc}")
    elapsed = time.monotonic() - t0
    stdout = proc.stdout.decode("utf-8", "replace")
    for line in reversed(stdout.splitlines()):
        if line.startswith(PROBE_MARK):
            try:
                data = json.loads(line[len(PROBE_MARK):])
            except ValueError:
                break
            if isinstance(data, dict):
                return PythonProbe.from_output(exe, data, elapsed)
            break
    stderr = proc.stderr.decode("utf-8", "replace").strip()
    tail = stderr.splitlines()[-1] if stderr else f"exit status {proc.returncode}, no report"
    if proc.returncode < 0:
        tail = f"killed by signal {-proc.returncode} ({tail})"
    return PythonProbe(python=exe, error=f"{exe} failed while being examined: {tail}", elapsed_s=round(elapsed, 3))


def refuse_unusable_python(python: str) -> None:
    """A --python the user typed that cannot be a Python executable is bad input, said as
    what it is (a folder, not executable, missing), not a finding."""
    from kohya_tuner.errors import UserError

    hint = "Give the python executable of the environment that runs sd-scripts (e.g. sd-scripts/venv/bin/python)."
    p = Path(python)
    if p.is_dir():
        inside = [c for c in (p / "bin" / "python", p / "Scripts" / "python.exe", p / "python.exe", p / "python")
                  if c.is_file()]
        raise UserError(f"--python {python} is a folder, not a Python executable.",
                        f"Did you mean {inside[0]}?" if inside else hint)
    if p.is_file():
        if os.name == "posix" and not os.access(p, os.X_OK):
            raise UserError(f"--python {python} is not executable.", hint)
        return
    if os.sep not in python and (os.altsep is None or os.altsep not in python) and shutil.which(python):
        return  # a command name found on PATH, like `python3`
    if p.exists():  # a device, a pipe, a socket: there is something, but no program
        raise UserError(f"--python {python} is not a regular file, so no Python executable.", hint)
    raise UserError(f"--python {python} does not exist.", hint)
