"""Which caching phases have nothing left to encode: the cache files sd-scripts would read are
already next to every image (data/cache_files.toml, the names per family at the pin).

Only folders are listed (a bounded number of entries each), no file is opened. A latent file
counts for an image whatever bucket size its name carries: the bucket an image falls in is not
worked out here. A phase counts as done only when every image of every folder has its file and
the config caches that kind to disk (an in-memory cache is encoded again on every start).
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from kohya_tuner.dataset.images import trainer_sees_suffix

_DATA = Path(__file__).resolve().parent.parent / "data" / "cache_files.toml"
MAX_ENTRIES = 50_000  # per folder: a larger folder is not checked (counted as not cached)
MAX_FOLDERS = 256
_KOHYA_SUBSET = re.compile(r"^\d+_")


@lru_cache(maxsize=None)
def names() -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    with open(_DATA, "rb") as fh:
        return tomllib.load(fh)["families"]


def _true(v: Any) -> bool:
    return v is True or str(v).strip().lower() == "true"


def _folders(config: dict[str, Any], dataset: dict[str, Any] | None) -> list[Path]:
    out: list[Path] = []
    if dataset:
        for ds in dataset.get("datasets") or []:
            for sub in (ds.get("subsets") or []) if isinstance(ds, dict) else []:
                if isinstance(sub, dict) and sub.get("image_dir"):
                    out.append(Path(str(sub["image_dir"])).expanduser())
    elif config.get("train_data_dir"):
        root = Path(str(config["train_data_dir"])).expanduser()
        try:
            subs = [root / e.name for e in os.scandir(root) if e.is_dir(follow_symlinks=False)
                    and _KOHYA_SUBSET.match(e.name)]
        except OSError:
            subs = []
        out.extend(subs or [root])
    return out[:MAX_FOLDERS]


def _listing(folder: Path) -> list[str] | None:
    out = []
    try:
        with os.scandir(folder) as it:
            for e in it:
                out.append(e.name)
                if len(out) > MAX_ENTRIES:
                    return None
    except OSError:
        return None
    return out


def done_phases(family_name: str, config: dict[str, Any], dataset: dict[str, Any] | None) -> frozenset[str]:
    """The caching phases ("cache_latents", "cache_text_encoder") whose files are all on disk."""
    spec = names().get(family_name)
    want_lat = bool(spec) and _true(config.get("cache_latents_to_disk"))
    want_te = bool(spec) and bool(spec.get("text_encoder")) and _true(config.get("cache_text_encoder_outputs_to_disk"))
    if not (want_lat or want_te):
        return frozenset()
    lat_name = re.compile(r"^(.*)_\d{4}x\d{4}" + re.escape(spec["latents"]) + "$")
    old = spec.get("old_latents")
    lat_ok, te_ok, n_images = want_lat, want_te, 0
    for folder in _folders(config, dataset):
        listing = _listing(folder)
        if listing is None:
            return frozenset()
        present = set(listing)
        with_latents = {m.group(1) for m in map(lat_name.match, listing) if m}
        for name in listing:
            if not trainer_sees_suffix(name):
                continue
            n_images += 1
            stem = os.path.splitext(name)[0]
            if lat_ok and stem not in with_latents and not (old and stem + old in present):
                lat_ok = False
            if te_ok and stem + spec["text_encoder"] not in present:
                te_ok = False
        if not (lat_ok or te_ok):
            break
    if not n_images:
        return frozenset()
    return frozenset(p for p, ok in (("cache_latents", lat_ok), ("cache_text_encoder", te_ok)) if ok)
