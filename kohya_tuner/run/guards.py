"""What `run` refuses before it plans, writes or launches anything: places it cannot
write, a `--continue` target that is no run folder, and flags `--continue` cannot apply.

Every refusal is a UserError naming the flag and the reason in words; the checks touch
nothing the user owns (a writability probe is a temporary file, removed at once)."""

from __future__ import annotations

import argparse
import os
import stat
import tempfile
from pathlib import Path
from typing import Callable

from kohya_tuner.errors import UserError
from kohya_tuner.fileio import why

# What --continue can apply: how it is watched and reported, not what it trains
# (run.json fixes that; any other flag would be dropped without a word).
CONTINUE_DESTS = {"continue_": "--continue", "dry_run": "--dry-run", "max_attempts": "--max-attempts",
                  "hang_timeout": "--hang-timeout", "json_events": "--json-events", "python": "--python",
                  "cpu": "--cpu", "json": "--json"}


def refuse_plan_flags_with_continue(args: argparse.Namespace,
                                    add_arguments: Callable[[argparse.ArgumentParser], None]) -> None:
    """Refuse every flag given with --continue that it cannot apply. `add_arguments` is the
    command's own, so a flag added later is covered without a list to keep up to date."""
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    flags = {}
    for a in parser._actions:
        long = [o for o in a.option_strings if o.startswith("--")]
        flags[a.dest] = long[0] if long else (a.option_strings[0] if a.option_strings else a.dest)
    defaults = vars(parser.parse_args([]))
    given = [flags.get(dest, dest) for dest, default in defaults.items()
             if dest not in CONTINUE_DESTS and getattr(args, dest, default) != default]
    if given:
        raise UserError(f"--continue picks the run up with the settings in its run.json; {', '.join(given)} "
                        f"cannot be applied to it.",
                        f"Drop {'them' if len(given) > 1 else 'it'}, or start a new run in another --out. "
                        f"With --continue these apply: {', '.join(v for v in CONTINUE_DESTS.values())}.")


def continue_folder(path: Path) -> Path:
    if not path.exists():
        raise UserError(f"--continue {path} does not exist.", "Give the --out folder of an earlier `kohya-tuner run`.")
    if not path.is_dir():
        raise UserError(f"--continue {path} is a file, not a run folder.",
                        "Give the --out folder of an earlier `kohya-tuner run` (the folder that holds run.json).")
    return path.absolute()


def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not os.path.lexists(p) and p.parent != p:
        p = p.parent
    return p


def _probe_write(folder: Path, what: str) -> None:
    try:
        fd, tmp = tempfile.mkstemp(prefix=".kohya-tuner-probe.", dir=folder)
    except OSError as exc:
        raise UserError(f"{what} cannot be written: {why(exc)}.",
                        "Choose a folder you can write to.") from None
    os.close(fd)
    os.unlink(tmp)


def writable_folder(path: Path, flag: str = "--out") -> None:
    """`path` (which may not exist yet) can be created and written to."""
    from kohya_tuner.safeio import describe

    base = _nearest_existing(path)
    if not base.is_dir():
        raise UserError(f"{flag} {path}: {base} is {describe(base)}, not a folder.")
    _probe_write(base, f"{flag} {path}" + ("" if base == path.absolute() else f" (in {base})"))


def events_file(path: Path) -> None:
    """--json-events names a file that can be appended to (checked before anything runs,
    --dry-run included, so a typo is not found hours later)."""
    if path.is_dir():
        raise UserError(f"--json-events {path} is a folder; it needs a file name.",
                        f"For example --json-events {path / 'events.jsonl'}.")
    if os.path.lexists(path):
        try:
            mode = path.stat().st_mode
        except OSError as exc:
            raise UserError(f"--json-events {path} cannot be used: {why(exc)}.") from None
        if not stat.S_ISREG(mode):
            from kohya_tuner.safeio import describe

            raise UserError(f"--json-events {path} is {describe(path)}, not a regular file.",
                            "Give a file name; events are appended to it.")
        if not os.access(path, os.W_OK):
            raise UserError(f"--json-events {path} cannot be written: permission denied or read-only.")
        return
    writable_folder(path.parent, f"--json-events {path}:")
