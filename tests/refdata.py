"""Where the reference data beside the checkout lives (../shared), for tests that read it."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


def shared_path(*parts: str) -> Path:
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"reference data {path} is not present")
    return path
