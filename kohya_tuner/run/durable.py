"""Journal writes that survive a second Ctrl-C, a killed supervisor and a full disk.

An attempt's record used to reach attempts.jsonl only when the attempt had ended and
been parsed; a second Ctrl-C during the stop, or a SIGKILL of kohya-tuner, left no
record, and `--continue` then started attempt 1 again from step 0 over the first
attempt's log. Now the record is on disk before anything can be lost:

* `attempt-N.pending.json` is written (atomically: temp file, fsync, rename) when the
  attempt starts, and again with the progress so far the moment a stop signal arrives,
  before the trainer is signalled. The final line in attempts.jsonl replaces it.
  `pending_records` lets the journal count an attempt that never got its final line.
* A reserve file of a few MiB is written when the run starts and deleted the moment a
  journal write meets a full disk, so the record, the summary and the report that say
  *why* the run stopped still fit.
"""

from __future__ import annotations

from kohya_tuner import jsontext, safeio
import errno
import json
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, TypeVar

RESERVE_NAME = ".kohya-tuner.reserve"
RESERVE_BYTES = 4 * 1024 * 1024
_PENDING = re.compile(r"attempt-(\d+)\.pending\.json$")
T = TypeVar("T")


def pending_path(out: Path, attempt: int) -> Path:
    return Path(out) / f"attempt-{attempt}.pending.json"


def snapshot(record: Any, progress: Any | None, outcome: str) -> Any:
    """`record` as it stands now: the steps and states seen so far, marked `outcome`."""
    if progress is None:
        return replace(record, outcome=outcome)
    return replace(record, outcome=outcome, end_step=progress.step, states=list(progress.states),
                   note=(record.note + "; " if record.note else "") + "recorded when the stop began")


def write_pending(out: Path, record: Any) -> None:
    from kohya_tuner.fileio import atomic_write

    text = jsontext.dumps(record.to_json()) + "\n"
    with_room(out, lambda: atomic_write(pending_path(out, record.attempt), text))


def clear_pending(out: Path, attempt: int) -> None:
    try:
        os.unlink(pending_path(out, attempt))
    except FileNotFoundError:
        pass


def pending_records(out: Path, journaled: set[int], from_json: Callable[[dict], T]) -> list[T]:
    """Records of attempts whose final line never reached attempts.jsonl."""
    found = []
    try:
        names = os.listdir(out)
    except OSError:
        return []
    for name in names:
        m = _PENDING.match(name)
        if not m or int(m.group(1)) in journaled:
            continue
        try:
            raw = safeio.read_regular(Path(out) / name, safeio.JOURNAL_BYTES)
            found.append((int(m.group(1)), from_json(json.loads(raw.decode("utf-8")))))
        except (OSError, ValueError, TypeError, KeyError, RecursionError):
            continue
    return [r for _n, r in sorted(found, key=lambda x: x[0])]


def make_reserve(out: Path, size: int = RESERVE_BYTES) -> bool:
    """Set space aside for the journal. False when even that does not fit (then the
    disk is already full, which pre-flight reports)."""
    path = Path(out) / RESERVE_NAME
    try:
        if path.is_file() and path.stat().st_size >= size:
            return True
        with open(path, "wb") as fh:
            chunk = b"\0" * 65536
            for _ in range(size // len(chunk)):
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        return True
    except OSError:
        free_reserve(out)
        return False


def free_reserve(out: Path) -> bool:
    try:
        os.unlink(Path(out) / RESERVE_NAME)
        return True
    except OSError:
        return False


def with_room(out: Path, write: Callable[[], T]) -> T:
    """Run `write`; when the disk is full, give up the reserve and try once more."""
    try:
        return write()
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not free_reserve(out):
            raise
        return write()


def append_line(path: Path, line: str) -> None:
    """One record, one write(2) on an O_APPEND descriptor, then fsync: a crash leaves the
    line whole or cut (the reader skips a cut line), never interleaved."""
    data = (line + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)
