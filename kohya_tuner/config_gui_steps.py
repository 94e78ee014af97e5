"""The steps the kohya_ss GUI counts for a file that says `max_train_steps` 0, and what its TOML
writer does to the values it writes.

A GUI file with `max_train_steps` 0 and no dataset file does not mean sd-scripts' default of 1,600
steps: the GUI's train_model lists the image folder and passes ceil(images x repeats / batch /
accumulation x epoch (x 2 with a regularisation folder)); the Finetune tab counts the images in
its image folder times `dataset_repeats` (halved with flip_aug, which config_gui_full does). The
folder is on the user's disk, so it is counted here the way the GUI counts it (its names, not
what they hold: a name ending .png is an image). Where the folder is not there, nothing can be
counted and a note says what the GUI would do.

The GUI writes its TOML with toml 0.10.2, whose writer puts `\\x` into a string as it is and turns
characters it would print as `\\xNN` into the letters `xNN`; sd-scripts reads that TOML back with the
same library. What it reads is what trains, and a string it cannot read stops the launch.
"""

from __future__ import annotations

import math
import os
from typing import Any

from kohya_tuner.errors import UserError

_IMAGE_ENDINGS = (".jpg", ".jpeg", ".png", ".webp")
# More entries than this, over the folder and its subfolders, is no image folder a GUI user points at
# (a disk root, say): not counted.
_MAX_ENTRIES = 500_000


def _listing(folder: str, budget: list[int]) -> list[os.DirEntry] | None:
    """The folder's entries, drawing on `budget` (entries left to list); None past it or on an error."""
    try:
        with os.scandir(folder) as it:
            out = []
            for entry in it:
                out.append(entry)
                budget[0] -= 1
                if budget[0] < 0:
                    return None
            return out
    except (OSError, ValueError):  # ValueError: a NUL in the name
        return None


def _images(entries: list[os.DirEntry]) -> int:
    return sum(1 for e in entries if e.name.lower().endswith(_IMAGE_ENDINGS))


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()  # follows a link, as os.path.isdir does
    except OSError:
        return False


def _ceil_steps(images_times_repeats: int, f: Any, factor: int = 1) -> int:
    try:
        return int(math.ceil(float(images_times_repeats) / int(f.train_batch_size)
                             / int(f.gradient_accumulation_steps) * int(f.epoch) * factor))
    except ZeroDivisionError:
        raise UserError("The kohya_ss file holds a value the GUI cannot use: train_batch_size or "
                        "gradient_accumulation_steps is 0, and the GUI divides by it to count the steps.") from None


def counted_steps(tab: str, f: Any) -> tuple[int | None, str | None]:
    """(max_train_steps the GUI passes, a note) for a form whose max_train_steps is 0 and that
    names no dataset file; (None, note) where the folder cannot be listed here."""
    if tab == "finetune":
        folder = str(f.image_folder)
        entries = _listing(folder, [_MAX_ENTRIES]) if folder else None
        if entries is None:
            return None, _not_counted(folder, "image_folder")
        images = _images(entries)
        steps = _ceil_steps(images * int(f.dataset_repeats), f)
        return steps, (f"max_train_steps is 0 in the file: the GUI counts {images} image(s) in {folder} x "
                       f"dataset_repeats {f.dataset_repeats} and passes {steps if steps else 'none'}"
                       + (" (sd-scripts then trains its default of 1600 steps)" if not steps else ""))
    folder = str(f.train_data_dir)
    budget = [_MAX_ENTRIES]
    entries = _listing(folder, budget) if folder else None
    if entries is None:
        return None, _not_counted(folder, "train_data_dir")
    total = 0
    for entry in entries:
        if not _is_dir(entry):
            continue
        try:
            repeats = int(entry.name.split("_")[0])
        except ValueError:  # the GUI skips a folder without a number before "_"
            continue
        inner = _listing(os.path.join(folder, entry.name), budget)
        if inner is None:
            return None, _not_counted(os.path.join(folder, entry.name), "train_data_dir")
        total += repeats * _images(inner)
    reg = 1 if f.reg_data_dir == "" else 2
    steps = _ceil_steps(total, f, reg)
    return steps, (f"max_train_steps is 0 in the file: the GUI counts {total} image pass(es) per epoch in "
                   f"{folder} (images x the repeats before each folder's '_')"
                   + (", doubled for the regularisation folder," if reg == 2 else "")
                   + f" and passes {steps if steps else 'none'}"
                   + (" (sd-scripts then trains its default of 1600 steps)" if not steps else ""))


def _not_counted(folder: str, field: str) -> str:
    return (f"max_train_steps is 0 in the file: the GUI sets it from the images in {field} "
            f"({folder or 'empty'}), which cannot be listed here, so the steps are not known; the GUI refuses "
            "a folder that does not exist")


def as_read_back(toml_data: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[tuple[str, str]]]:
    """The values as sd-scripts reads them from the TOML the GUI writes: (values, notes on changed
    strings, [(key, why)] for values that stop the launch)."""
    import toml

    out = dict(toml_data)
    notes: list[str] = []
    broken: list[tuple[str, str]] = []
    for key, value in toml_data.items():
        if not _holds_text(value):
            continue
        try:
            text = toml.dumps({key: value})
        except Exception as exc:  # noqa: BLE001 - the GUI's writer failing is the finding
            broken.append((key, f"the GUI's TOML writer (toml 0.10.2) fails on this value ({type(exc).__name__}), "
                                "so the GUI cannot write its config"))
            continue
        try:
            back = toml.loads(text)[key]
        except Exception:  # noqa: BLE001 - toml.TomlDecodeError and what a damaged text raises
            broken.append((key, f"the GUI writes {value!r} into its TOML with a backslash toml 0.10.2 does not "
                                "escape (\\x), and sd-scripts cannot read that TOML back (\"Reserved escape sequence "
                                "used\"): the launch stops at start-up. Write the path with forward slashes, or "
                                "rename the folder that starts with x"))
            continue
        if back != value:
            out[key] = back
            notes.append(f"{key}: the GUI's TOML writer (toml 0.10.2) writes {value!r} as {back!r}, which is "
                         "what sd-scripts reads (a no-break space or control character becomes the letters of "
                         "its code)")
    return out, notes, broken


def _holds_text(value: Any) -> bool:
    if isinstance(value, str):
        return not value.isascii() or "\\" in value or not value.isprintable()
    if isinstance(value, list):
        return any(_holds_text(v) for v in value)
    return False
