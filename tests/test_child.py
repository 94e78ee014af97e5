"""A probe of the trainer's Python that hangs is ended with everything it started."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from kohya_tuner.child import run_bounded

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="a POSIX shell wrapper")


def _wrapper(tmp_path, body: str):
    exe = tmp_path / "python"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(0o755)
    return str(exe)


def _left(marker: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in p.info["cmdline"] or []):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


@pytest.mark.parametrize("body", ["sleep {m} & wait\n", "sleep {m}\n", "(sleep {m}) & (sleep {m}) & wait\n"],
                         ids=["background-child", "exec-less-child", "two-children"])
def test_a_hanging_wrapper_leaves_no_process_behind(tmp_path, body):
    marker = f"{4000 + os.getpid() % 1000}.{time.monotonic_ns() % 997}"
    exe = _wrapper(tmp_path, body.format(m=marker))
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_bounded([exe, "-c", "pass"], timeout_s=1)
    assert time.monotonic() - t0 < 10
    deadline = time.monotonic() + 5
    while _left(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _left(marker) == []


def test_the_probes_report_a_hang_and_leave_nothing(tmp_path):
    from kohya_tuner.doctor import probe_python
    from kohya_tuner.run.launcher import probe_modules

    marker = f"{5000 + os.getpid() % 1000}.{time.monotonic_ns() % 991}"
    exe = _wrapper(tmp_path, f"sleep {marker} & wait\n")
    assert "did not answer" in probe_modules(exe, ["torch"], timeout_s=1)["error"]
    assert "did not answer" in (probe_python(exe, timeout=1).error or "")
    time.sleep(0.5)
    assert _left(marker) == []


def test_output_that_is_no_utf8_is_read_not_raised(tmp_path):
    exe = _wrapper(tmp_path, "printf '\\377\\376 x\\n'\n")
    got = run_bounded([exe], timeout_s=10, text=True)
    assert got.returncode == 0 and got.stdout.endswith(" x\n")
