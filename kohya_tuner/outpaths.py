"""Every setting that names a place sd-scripts writes to stays inside the run folder.

sd-scripts joins `output_dir` and `output_name` (and `logging_dir` and `log_prefix`) by
string, so a name holding `/` or `..` writes LoRA files and state folders anywhere. One
function, `confine`, is called by `config`, `fit` and `run` before they write anything:

* a name key (joined onto a folder) must be a plain file name, short enough that the
  longest name sd-scripts and `run` derive from it still fits the filesystem's limit;
* a folder or file key must lie inside `root` when the command chose the run folder
  (`config --out`, `run --out`). `fit` rewrites the user's own config, whose folders
  are the user's choice, so it gets the name rules only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from kohya_tuner.errors import UserError

# Joined onto output_dir / logging_dir as text by the pinned sd-scripts
# (library/train_util.py: get_sai_model_spec callers, save_*; init_trackers for log_prefix).
NAME_KEYS = ("output_name", "log_prefix")
# Places written to: checkpoints and states, tracker logs, the plain-text log file.
PATH_KEYS = ("output_dir", "logging_dir", "console_log_file")

# The longest thing appended to a name: run's "-attempt100" and sd-scripts'
# "-step00000000-state" (STEP_STATE_NAME) or "-step00000000.safetensors".
LONGEST_SUFFIX = len("-attempt100") + len("-step00000000.safetensors")
NAME_MAX = 255  # bytes, ext4/xfs/btrfs/tmpfs; os.pathconf is asked where it answers


def _name_max(folder: Path | None) -> int:
    probe = folder
    while probe is not None and not probe.exists() and probe.parent != probe:
        probe = probe.parent
    try:
        return int(os.pathconf(probe or ".", "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return NAME_MAX


def name_problem(value: Any, folder: Path | None = None) -> str | None:
    """Why `value` is no plain file name sd-scripts can write under, or None."""
    if not isinstance(value, str):
        return None  # the schema check names a wrong type
    if value in ("", ".", ".."):
        return "is empty or a folder name ('.', '..')"
    if any(c in value for c in "/\\\0"):
        return "holds a folder separator, so files would be written outside the run folder"
    if value != value.strip():
        return "starts or ends with a space"
    limit = _name_max(folder) - LONGEST_SUFFIX
    if len(value.encode("utf-8", "surrogateescape")) > limit:
        return (f"is {len(value.encode('utf-8', 'surrogateescape'))} bytes long; with what sd-scripts appends "
                f"(e.g. -attempt2-step00000040-state) a name may be at most {limit} bytes on this filesystem")
    return None


def _inside(path: Path, root: Path) -> bool:
    p = Path(os.path.normpath(path.expanduser().absolute()))
    r = Path(os.path.normpath(root.expanduser().absolute()))
    try:
        # Links already on disk count where they lead.
        p, r = p.resolve(strict=False), r.resolve(strict=False)
    except (OSError, RuntimeError):
        pass
    return p == r or r in p.parents


def problems(config: Mapping[str, Any], root: Path | None = None) -> list[tuple[str, str]]:
    """(key, why) for every output setting that would write outside `root` or break a name."""
    out = []
    folder = Path(config["output_dir"]) if isinstance(config.get("output_dir"), str) else root
    for key in NAME_KEYS:
        if key in config and config[key] is not None:
            why = name_problem(config[key], folder)
            if why:
                out.append((key, f"{key} = {config[key]!r} {why}"))
    if root is not None:
        for key in PATH_KEYS:
            value = config.get(key)
            if isinstance(value, str) and value and not _inside(Path(value), root):
                out.append((key, f"{key} = {value!r} is outside the run folder {root}"))
    return out


def confine(config: Mapping[str, Any], root: Path | None = None, *, what: str = "The config") -> None:
    """Raise a UserError naming every output setting that escapes `root` or breaks a name."""
    found = problems(config, root)
    if found:
        keys = [k for k, _ in found]
        hint = []
        if names := [k for k in keys if k in NAME_KEYS]:
            hint.append(f"Give {' and '.join(names)} a plain file name")
        if folders := [k for k in keys if k in PATH_KEYS]:
            hint.append(f"keep {' and '.join(folders)} inside --out, or leave {'them' if len(folders) > 1 else 'it'} "
                        "unset (kohya-tuner sets output_dir for you)")
        text = "; ".join(hint) + "."
        raise UserError(f"{what} writes where it must not: " + "; ".join(why for _, why in found) + ".",
                        text[0].upper() + text[1:])


def config_file_name(path: Path, flag: str = "--out") -> None:
    """sd-scripts reads `--config_file X` as X + ".toml" unless X ends in ".toml" (exactly,
    lower case: library/train_util.py:read_config_from_file, line 4704 at the pin), so a
    config written under another name is never found by the trainer."""
    if not str(path).endswith(".toml"):
        raise UserError(f"{flag} {path} does not end in .toml; sd-scripts would look for {path}.toml instead "
                        f"and stop with 'config file not found'.",
                        f"Name it {Path(str(path)).with_suffix('.toml').name if Path(str(path)).suffix else str(path) + '.toml'}.")


def extra_file(path: Path, root: Path, flag: str) -> Path:
    """A further file the user names for a command to write (`--gui-json`): a bare file name is
    put in `root` (the folder the command writes to); a path must lie inside `root`, as every
    file kohya-tuner writes does."""
    p = Path(path)
    if p.name in ("", ".", ".."):
        raise UserError(f"{flag} {path} names a folder, not a file.", f"Give a file name, e.g. {flag} kohya_gui.json.")
    if p.parent == Path(".") and not p.is_absolute():
        return Path(root) / p
    if not _inside(p, Path(root)) or _inside(Path(root), p):
        raise UserError(f"{flag} {path} is outside {root}; kohya-tuner writes its files only there.",
                        f"Give a file name (it is written into {root}) or a path inside it.")
    return p
