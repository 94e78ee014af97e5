from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from tests.refdata import REPO, SHARED, shared_path  # noqa: F401 - re-exported for older imports


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    """No test may read or write the real user data directory or see a real checkout."""
    home = tmp_path_factory.mktemp("kt-home")
    monkeypatch.setenv("KOHYA_TUNER_HOME", str(home))
    monkeypatch.delenv("KOHYA_SD_SCRIPTS", raising=False)
    yield


@pytest.fixture(autouse=True)
def _ctrl_c_reaches_python():
    """Tests that press Ctrl-C (a SIGINT to this process) need Python's own handler. A suite started as
    a background job of a non-interactive shell inherits SIGINT ignored, and there such a test would
    wait for a Ctrl-C that never arrives."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
