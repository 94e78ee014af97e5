from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    """No test may read or write the real user data directory or see a real checkout."""
    home = tmp_path_factory.mktemp("kt-home")
    monkeypatch.setenv("KOHYA_TUNER_HOME", str(home))
    monkeypatch.delenv("KOHYA_SD_SCRIPTS", raising=False)
    yield


def shared_path(*parts: str) -> Path:
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"reference data {path} is not present")
    return path
