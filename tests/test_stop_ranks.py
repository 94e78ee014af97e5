"""Stopping a launch ends the ranks a launcher started in sessions of their own (torchrun does so),
even ranks deaf to SIGINT and SIGTERM, and nothing else."""

from __future__ import annotations

import os
import sys
import textwrap
import time

import psutil
import pytest

from kohya_tuner.run.launcher import spawn, stop_group

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX sessions")

RANK = textwrap.dedent("""
    import signal, sys, time
    if sys.argv[1] == "deaf":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("rank up", flush=True)
    time.sleep(600)
""")

LAUNCHER = textwrap.dedent("""
    import subprocess, sys, time, signal
    # Like torchrun: each rank in its own session; the agent forwards nothing and dies on SIGINT.
    ranks = [subprocess.Popen([sys.executable, sys.argv[1], mode], start_new_session=True)
             for mode in sys.argv[2:]]
    print("launcher up", flush=True)
    time.sleep(600)
""")


def _start(tmp_path, *modes):
    (tmp_path / "rank.py").write_text(RANK)
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    proc = spawn([sys.executable, str(tmp_path / "launcher.py"), str(tmp_path / "rank.py"), *modes], os.environ)
    deadline = time.monotonic() + 30
    ranks: list[psutil.Process] = []
    while time.monotonic() < deadline and len(ranks) < len(modes):
        ranks = psutil.Process(proc.pid).children(recursive=True)
        time.sleep(0.05)
    assert len(ranks) == len(modes)
    return proc, ranks


def _gone(ranks, within=5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in ranks):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("modes", [("deaf", "deaf"), ("plain", "deaf"), ("plain", "plain")])
def test_ranks_in_their_own_sessions_end_with_the_launch(tmp_path, modes):
    proc, ranks = _start(tmp_path, *modes)
    bystander = psutil.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        sent = stop_group(proc, grace_s=0.5)
        assert proc.poll() is not None
        assert _gone(ranks), [p.pid for p in ranks if p.is_running()]
        assert "SIGKILL" in sent
        assert bystander.is_running()  # not a descendant: never signalled
    finally:
        bystander.kill()
        for p in ranks:
            try:
                p.kill()
            except psutil.Error:
                pass
