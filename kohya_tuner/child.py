"""The one bounded run of a short child process (a Python probe): its own process group, and at the
time limit the whole group is killed, so a wrapper script's own children do not outlive it."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Mapping, Sequence

_WINDOWS = os.name == "nt"


def run_bounded(argv: Sequence[str], *, timeout_s: float, cwd: str | None = None,
                env: Mapping[str, str] | None = None, text: bool = False) -> subprocess.CompletedProcess:
    """Run `argv` with both pipes captured and stdin closed. Raises FileNotFoundError,
    PermissionError or OSError as Popen does, and subprocess.TimeoutExpired once the group is gone."""
    group = ({"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP} if _WINDOWS  # type: ignore[attr-defined]
             else {"start_new_session": True})
    proc = subprocess.Popen(list(argv), cwd=cwd, env=dict(env) if env is not None else None,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            encoding="utf-8" if text else None, errors="replace" if text else None, **group)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            # A grandchild that left the group still holds a pipe: stop reading it.
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            proc.wait()
        raise
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


def _kill_group(proc: subprocess.Popen) -> None:
    if _WINDOWS:
        subprocess.run(["taskkill", "/F", "/T", "/PID", str(proc.pid)], capture_output=True)
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child leads its own group (start_new_session)
    except (ProcessLookupError, PermissionError):
        proc.kill()
