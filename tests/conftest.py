from __future__ import annotations

import os
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
