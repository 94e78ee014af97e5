"""Where the shipped data lives: presets/ and vendor/ beside the package in a
source checkout (and editable installs), kohya_tuner/_data/ inside a wheel."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

_PKG = Path(__file__).resolve().parent


@lru_cache(maxsize=None)
def data_dir(name: str) -> Path:
    """Return the directory of shipped data `name` ("presets" or "vendor")."""
    for candidate in (_PKG / "_data" / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"kohya-tuner data directory {name!r} is missing from this install")


def vendor_file(*parts: str) -> Path:
    return data_dir("vendor").joinpath(*parts)


def presets_dir() -> Path:
    return data_dir("presets")


def user_data_dir() -> Path:
    """Per-user data (sd-scripts checkout, run history). KOHYA_TUNER_HOME overrides it,
    which is also how tests keep away from the real home directory."""
    import os

    override = os.environ.get("KOHYA_TUNER_HOME")
    if override:
        return Path(override)
    from platformdirs import user_data_path

    return user_data_path("kohya-tuner", appauthor=False)
