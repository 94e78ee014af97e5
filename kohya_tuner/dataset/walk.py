"""Which files in a dataset folder sd-scripts will read, and what the rest are.

sd-scripts reads one folder per subset, not its subfolders. The kohya_ss layout puts
each subset in a subfolder named `<repeats>_<class tokens>` under a parent that holds no
pictures itself; such a parent is read that way.

Links: a link to a file is read like the file (sd-scripts' glob follows it, and prep
copies what it points at). A link to a folder is never entered, neither as a subset nor
when looking for nested images: it can lead out of the dataset or back into it, and the
dataset TOML kohya-tuner writes lists only real folders, so sd-scripts does not read it
either. Names starting with a dot are skipped, as sd-scripts' glob skips them.
"""

from __future__ import annotations

import errno
import os
import re
import stat as stat_mod
from dataclasses import dataclass, field
from pathlib import Path

from kohya_tuner.dataset.images import (CAPTION_EXTENSIONS, CONVERTIBLE_EXTENSIONS, TRAINER_EXTENSIONS,
                                        trainer_sees_suffix)
from kohya_tuner.errors import UserError

MANIFEST_NAME = "kohya-tuner-manifest.json"
TMP_SUFFIX = ".kt-tmp"

# Files operating systems and sd-scripts itself leave in folders; never worth a warning.
_JUNK_NAMES = {".ds_store", "thumbs.db", "desktop.ini", ".directory", MANIFEST_NAME.lower()}
_TRAINER_SIDE_FILES = (".npz",)  # latent / text-encoder caches written next to images
_TRAINER_SIDE_NAMES = {"metadata_cache.json"}  # written with cache_info = true
_KOHYA_SUBSET = re.compile(r"^(\d+)_(.*)$")
_MAX_DEPTH = 4


def display(path: str) -> str:
    """A file name that can always be printed and written as UTF-8, even when the name on
    disk is not valid UTF-8 (those bytes come back as U+FFFD), with control characters
    (terminal escape sequences) shown as `\\xNN`, never sent raw."""
    from kohya_tuner.printable import printable

    return printable(path.replace(os.sep, "/"))


@dataclass
class Entry:
    rel: str  # relative path as the OS names it (may hold surrogate escapes)
    kind: str  # "image", "convertible", "caption", "other"
    subset: str  # rel dir of the subset it belongs to ("" = root)

    @property
    def shown(self) -> str:
        return display(self.rel)


@dataclass
class SubsetDir:
    rel: str
    repeats: int | None = None
    class_tokens: str | None = None


@dataclass
class Listing:
    root: Path
    entries: list[Entry] = field(default_factory=list)
    subsets: list[SubsetDir] = field(default_factory=list)
    # Images in folders sd-scripts will not read: rel paths.
    nested: list[str] = field(default_factory=list)
    # Paths that could not be listed or followed, with the reason.
    unlistable: list[tuple[str, str]] = field(default_factory=list)
    # Links to folders, never entered: rel paths.
    linked_dirs: list[str] = field(default_factory=list)
    # Pictures whose name starts with a dot, which sd-scripts' glob does not match.
    hidden: list[str] = field(default_factory=list)


def _classify(name: str) -> str | None:
    lower = name.lower()
    if lower in _JUNK_NAMES or name.startswith("._") or name.endswith(TMP_SUFFIX):
        return None
    if lower in _TRAINER_SIDE_NAMES or lower.endswith(_TRAINER_SIDE_FILES):
        return None
    suffix = os.path.splitext(lower)[1]
    if suffix in TRAINER_EXTENSIONS:
        return "image"
    if suffix in CONVERTIBLE_EXTENSIONS:
        return "convertible"
    if suffix in CAPTION_EXTENSIONS:
        return "caption"
    return "other"


def check_folder(path: str | os.PathLike) -> Path:
    """The folder to read, or a UserError saying plainly why it cannot be."""
    p = Path(path).expanduser()
    shown = display(str(path))
    try:
        st = p.stat()
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserError(f"{shown} is a symbolic link that loops back on itself.",
                            "Point at the real folder that holds the images.") from None
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise UserError(f"{shown} cannot be read: permission denied.") from None
        raise UserError(f"{shown} does not exist.", "Give the folder that holds the training images.") from None
    if not stat_mod.S_ISDIR(st.st_mode):
        raise UserError(f"{shown} is a file, not a folder.",
                        "Give the folder that holds the training images (and their caption .txt files).")
    try:
        return p.resolve(strict=True)
    except (OSError, RuntimeError):
        raise UserError(f"{shown} cannot be resolved (a symbolic link loop on the way?).") from None


def _scandir(path: Path) -> list[os.DirEntry]:
    with os.scandir(path) as it:
        return sorted(it, key=lambda e: e.name)


def list_dataset(root: Path) -> Listing:
    """Walk the dataset folder the way sd-scripts will read it. `root` must come from
    check_folder(). Raises UserError when the folder is unreadable or holds nothing."""
    listing = Listing(root=root)
    try:
        top = _scandir(root)
    except OSError as exc:
        raise UserError(f"{display(str(root))} cannot be listed: {exc.strerror or exc}.") from None
    if not top:
        raise UserError(f"{display(str(root))} is empty.", "Put the training images (and captions) in it first.")

    files, dirs = _split(top, listing, "")
    # A folder of <repeats>_<tokens> subfolders and no pictures of its own is the kohya_ss
    # layout. With pictures of its own it is one subset (and a "2024_trip" subfolder is
    # just a subfolder, not 2024 repeats).
    root_has_pictures = any(_classify(e.name) in ("image", "convertible") and not e.name.startswith(".")
                            for e in files)
    kohya_dirs = [] if root_has_pictures else [d for d in dirs if _KOHYA_SUBSET.match(d.name) and _has_pictures(d)]
    visited = {_inode(root)}
    if kohya_dirs:
        for d in kohya_dirs:
            m = _KOHYA_SUBSET.match(d.name)
            assert m
            rel = d.name
            listing.subsets.append(SubsetDir(rel, int(m.group(1)), m.group(2).strip() or None))
            visited.add(_inode(Path(d.path)))
            try:
                sub_files, sub_dirs = _split(_scandir(Path(d.path)), listing, rel)
            except OSError as exc:
                listing.unlistable.append((rel, exc.strerror or str(exc)))
                continue
            _add_files(listing, sub_files, rel)
            for sd in sub_dirs:
                _find_nested(listing, Path(sd.path), os.path.join(rel, sd.name), visited, 2)
        _add_files(listing, files, "")
        for d in dirs:
            if d not in kohya_dirs:
                _find_nested(listing, Path(d.path), d.name, visited, 1)
    else:
        listing.subsets.append(SubsetDir(""))
        _add_files(listing, files, "")
        for d in dirs:
            _find_nested(listing, Path(d.path), d.name, visited, 1)
    return listing


def _inode(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_dev, st.st_ino


def _split(entries: list[os.DirEntry], listing: Listing, rel_dir: str) -> tuple[list[os.DirEntry], list[os.DirEntry]]:
    """Files and real folders; links to folders are recorded in `listing` and dropped."""
    files, dirs = [], []
    for e in entries:
        try:
            is_dir = e.is_dir()  # follows links; a looping link raises or reads as not-a-dir
        except OSError:
            is_dir = False
        if is_dir and trainer_sees_suffix(e.name) and not e.name.startswith("."):
            # sd-scripts' glob matches the name, then fails opening a folder as an image.
            files.append(e)
        elif is_dir and e.is_symlink():
            listing.linked_dirs.append(os.path.join(rel_dir, e.name) if rel_dir else e.name)
        elif is_dir:
            dirs.append(e)
        else:
            files.append(e)  # a file, or a broken link reported per file later
    return files, dirs


def _has_pictures(d: os.DirEntry) -> bool:
    try:
        with os.scandir(d.path) as it:
            return any(_classify(e.name) in ("image", "convertible") and not e.name.startswith(".") for e in it)
    except OSError:
        return False


def _add_files(listing: Listing, files: list[os.DirEntry], rel_dir: str) -> None:
    for e in files:
        kind = _classify(e.name)
        if kind is None:
            continue
        rel = os.path.join(rel_dir, e.name) if rel_dir else e.name
        if e.name.startswith("."):
            if kind in ("image", "convertible"):
                listing.hidden.append(rel)
            continue
        listing.entries.append(Entry(rel, kind, rel_dir))


def _find_nested(listing: Listing, path: Path, rel: str, visited: set, depth: int) -> None:
    """Record images in folders sd-scripts will not read, without following loops."""
    if depth > _MAX_DEPTH:
        return
    try:
        key = _inode(path)
    except OSError as exc:
        listing.unlistable.append((rel, exc.strerror or str(exc)))
        return
    if key in visited:
        listing.unlistable.append((rel, "a symbolic link back to a folder already read (loop); skipped"))
        return
    visited.add(key)
    try:
        entries = _scandir(path)
    except OSError as exc:
        listing.unlistable.append((rel, exc.strerror or str(exc)))
        return
    files, dirs = _split(entries, listing, rel)
    for e in files:
        if _classify(e.name) in ("image", "convertible") and not e.name.startswith("."):
            listing.nested.append(os.path.join(rel, e.name))
    for d in dirs:
        _find_nested(listing, Path(d.path), os.path.join(rel, d.name), visited, depth + 1)


def guess_caption_extension(entries: list[Entry]) -> str:
    """.txt unless the folder clearly uses .caption (sd-scripts' own default)."""
    stems = {os.path.splitext(e.rel)[0] for e in entries if e.kind in ("image", "convertible")}
    score = {ext: sum(1 for e in entries if e.kind == "caption" and e.rel.endswith(ext)
                      and e.rel[: -len(ext)] in stems) for ext in (".txt", ".caption")}
    return ".caption" if score[".caption"] > score[".txt"] else ".txt"
