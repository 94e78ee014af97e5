"""Import model and network classes from a user's sd-scripts checkout at run time.

Nothing from sd-scripts is copied here: the caller passes the path of a checkout (for example the
pinned commit exported to /tmp).  sd-scripts' `library.utils` imports OpenCV and torchvision at module
level for image helpers the tracer never calls; when they are not installed, inert placeholder
modules stand in so the model classes can be imported without them.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import types


class _Inert(types.ModuleType):
    """Module whose every attribute is another inert object (only touched at import time)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        child = _Inert(f"{self.__name__}.{name}")
        setattr(self, name, child)
        return child

    def __call__(self, *a, **k):  # pragma: no cover - never called by the tracer
        raise RuntimeError(f"{self.__name__} is a placeholder; install the real package")


def _placeholder(name: str) -> None:
    if name in sys.modules:
        return
    try:
        if importlib.util.find_spec(name) is not None:
            return
    except (ImportError, ValueError):
        pass
    mod = _Inert(name)
    mod.__path__ = []  # lets `from name.sub import x` resolve through sys.modules
    sys.modules[name] = mod
    for sub in ("transforms",):
        subm = _Inert(f"{name}.{sub}")
        setattr(mod, sub, subm)
        sys.modules[f"{name}.{sub}"] = subm


def add_checkout(path: str) -> dict:
    """Put the checkout on sys.path; return {'path', 'commit'} for provenance."""
    path = os.path.abspath(path)
    if not os.path.isfile(os.path.join(path, "library", "flux_models.py")):
        raise SystemExit(f"{path} does not look like an sd-scripts checkout (no library/flux_models.py)")
    # diffusers and transformers probe for torchvision with find_spec when first imported; import them
    # before the placeholders exist so they record it as absent instead of tripping over a spec-less module
    for real in ("diffusers", "transformers"):
        try:
            importlib.import_module(real)
        except ImportError:
            pass
    for name in ("cv2", "torchvision"):
        _placeholder(name)
    if path not in sys.path:
        sys.path.insert(0, path)
    commit = None
    marker = os.path.join(path, ".commit")
    if os.path.isfile(marker):
        commit = open(marker, encoding="utf-8").read().strip()
    else:
        try:
            commit = subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True,
                                    check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            commit = None
    return {"path": path, "commit": commit}


def module(name: str):
    return importlib.import_module(name)
