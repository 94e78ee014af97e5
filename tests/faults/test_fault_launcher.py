"""The launcher never hangs and never dies silently: a log it cannot write stops the
trainer with a reason, each watchdog works on its own, and a second Ctrl-C hurries the
stop instead of unwinding the supervisor before it has written its record."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from kohya_tuner.run import launcher

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="process groups and /dev/full are POSIX")


def _script(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "child.py"
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path)]


def _gone(pids: list[int], within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
            return True
        time.sleep(0.05)
    return False


CHATTY_FOREVER = """
    import os, sys, time
    print(os.getpid(), flush=True)
    for i in range(10**9):
        print("step", i, "x" * 200, flush=True)
        time.sleep(0.01)
"""


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_log_write_failure_stops_the_trainer_with_a_reason(tmp_path):
    """ENOSPC on every log write (/dev/full): the run ends at once with the reason, the
    trainer's group is stopped, and the lines still reached the parser."""
    pids, lines = [], []

    def on_line(stream, line):
        lines.append(line)

    t0 = time.monotonic()
    res = launcher.run_process(_script(tmp_path, CHATTY_FOREVER), dict(os.environ), on_line=on_line,
                               log_path="/dev/full", hang_timeout_s=60, grace_s=3,
                               on_start=lambda p: pids.append(p.pid))
    assert time.monotonic() - t0 < 20
    assert res.stopped_by == "log_error" and "the disk is full" in res.failure
    assert "/dev/full" in res.failure and res.signals_sent and res.signals_sent[0] == "SIGINT"
    assert _gone(pids)
    assert lines, "output is still parsed when the log cannot be written"


def test_log_on_a_disk_that_fills_mid_run(tmp_path, tiny_disk):
    from tests.faults.conftest import fill

    pids = []
    log = tiny_disk / "attempt-1.log"
    fill(tiny_disk, leave=64 * 1024)
    res = launcher.run_process(_script(tmp_path, CHATTY_FOREVER), dict(os.environ), on_line=lambda s, ln: None,
                               log_path=log, hang_timeout_s=60, grace_s=3, on_start=lambda p: pids.append(p.pid))
    assert res.stopped_by == "log_error" and "the disk is full" in res.failure
    assert _gone(pids)
    assert log.stat().st_size > 0  # what fitted is kept


def test_child_gone_but_pipes_held_open_by_a_silent_grandchild(tmp_path):
    """The launcher exits; something it started keeps the pipes open and prints nothing.
    EOF never comes, the child is dead: the child watchdog ends it (no hang timeout set)."""
    argv = _script(tmp_path, """
        import subprocess, sys
        g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        print(g.pid, flush=True)
    """)
    seen = []
    t0 = time.monotonic()
    res = launcher.run_process(argv, dict(os.environ), on_line=lambda s, ln: seen.append(ln),
                               hang_timeout_s=None, grace_s=2, eof_grace_s=1.0)
    assert time.monotonic() - t0 < 15
    assert res.exit_status == 0
    assert _gone([int(seen[0])]), "the grandchild holding the pipes is stopped"


def test_silence_is_a_hang_even_when_the_launcher_already_exited(tmp_path):
    argv = _script(tmp_path, """
        import subprocess, sys
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    """)
    res = launcher.run_process(argv, dict(os.environ), on_line=lambda s, ln: None, hang_timeout_s=1.0,
                               grace_s=2, eof_grace_s=60)
    assert res.hung and res.stopped_by == "hang"


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_second_ctrl_c_hurries_the_stop_after_the_record_is_written(tmp_path):
    """Ctrl-C twice, 0.2 s apart, at a trainer that ignores SIGINT: on_interrupt runs
    while the trainer still lives (before any signal reaches it), no KeyboardInterrupt
    escapes, and the second press cuts the 30 s grace short."""
    argv = _script(tmp_path, """
        import signal, time
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("ready", flush=True)
        while True:
            print("step", flush=True)
            time.sleep(0.05)
    """)
    pids, order = [], []

    def on_line(stream, line):
        if line == "ready":
            me = os.getpid()
            threading.Timer(0.3, os.kill, (me, signal.SIGINT)).start()
            threading.Timer(0.5, os.kill, (me, signal.SIGINT)).start()

    def on_interrupt():
        order.append(("record", psutil.pid_exists(pids[0]) and psutil.Process(pids[0]).status() != "zombie"))
        time.sleep(0.4)  # the second Ctrl-C lands while the record is being written

    term_before = signal.getsignal(signal.SIGTERM)
    t0 = time.monotonic()
    res = launcher.run_process(argv, dict(os.environ), on_line=on_line, grace_s=30, on_interrupt=on_interrupt,
                               on_start=lambda p: pids.append(p.pid))
    assert time.monotonic() - t0 < 15
    assert order == [("record", True)]
    assert res.interrupted and res.signals_sent[:2] == ["SIGINT", "SIGTERM"]
    assert _gone(pids)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) is term_before  # the caller's handlers are back
