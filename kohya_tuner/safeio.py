"""Bounded, type-checked reading of every file a user hands a command.

One place decides what an input file may be: a regular file (a FIFO, a terminal, a device
or a folder is refused before any read, so nothing blocks or grows without end), at most
`MAX_BYTES` long, and once parsed, no deeper than `MAX_DEPTH` and holding only numbers
sd-scripts can carry (finite floats, 64-bit integers). Every refusal is a UserError that
names the file and, for values, the key.
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat
import sys
from typing import Any, BinaryIO

from kohya_tuner.errors import UserError

# Real configs, GUI files, dataset files and presets are kilobytes; a megabyte is far beyond
# any and keeps the pinned parser (quadratic on some long lines) well under a second.
MAX_BYTES = 1 << 20
MAX_DEPTH = 32
INT_LIMIT = 2 ** 63  # argparse's int is unbounded, but torch and the step counters are int64
BOM = b"\xef\xbb\xbf"
# toml 0.10.2 can take seconds on one very long line (its string building turns quadratic);
# no real config has a line of even a kilobyte.
MAX_LINE = 1 << 16
# Files kohya-tuner writes into a run folder (run.json, attempts.jsonl, summary.json, the lock,
# train_state.json): kilobytes, a journal of a hundred attempts well under a megabyte.
JOURNAL_BYTES = 16 << 20


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


class NotRegular(OSError):
    """The path is a FIFO, a device, a folder or a socket: never opened for reading."""


class TooLarge(OSError):
    """The file is larger than the reader's limit."""


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """A regular file opened for reading in binary; never blocks on a FIFO or a device.

    stat first, then an O_NONBLOCK open re-checked with fstat (the path may have been
    swapped for a FIFO since the stat). Raises FileNotFoundError, NotRegular (strerror says
    what the path is) or another OSError; the journal's readers treat all of them as a file
    they cannot use, the readers of user files turn them into a UserError."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegular(0, f"{_kind(st.st_mode)}, not a file", os.fsdecode(path))
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(0, f"{_kind(st.st_mode)}, not a file", os.fsdecode(path))
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; OSError (NotRegular, TooLarge,
    FileNotFoundError, ...) otherwise."""
    with open_regular(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:
            raise TooLarge(0, f"{size:,} bytes", os.fsdecode(path))
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(0, f"larger than {limit:,} bytes", os.fsdecode(path))  # it grew while read
    return data


def load_toml_file(path: str | os.PathLike, limit: int = JOURNAL_BYTES) -> dict[str, Any]:
    """A TOML file kohya-tuner wrote (an attempt's config), parsed by the pinned parser, read
    like any other: a FIFO or device in its place raises OSError (NotRegular) instead of
    blocking or reading without end. Damage raises ValueError and the like, as toml does."""
    import toml

    return toml.loads(read_regular(path, limit).decode("utf-8"))


def special_kind(path: str | os.PathLike) -> str | None:
    """What `path` is when it exists but is neither a regular file nor a folder (a FIFO, a
    device, a socket), in words; None otherwise (a missing path included)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else _kind(mode)


def describe(path: str | os.PathLike) -> str:
    """What is at `path`, in words, for a message: "a folder", "a file", "a named pipe",
    "a device", "a link to nothing", "nothing"."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a link to nothing" if os.path.islink(path) else "nothing"
    except (OSError, ValueError):
        return "unreadable"
    return "a file" if stat.S_ISREG(mode) else _kind(mode)


def require_regular(path: str | os.PathLike, what: str = "file") -> None:
    """UserError, in read_bytes' words, unless `path` is a regular file: for a file another
    program reads (accelerate's config), which must not block that program either."""
    try:
        with open_regular(path):
            pass
    except OSError as exc:
        _refuse(exc, path, what, MAX_BYTES)


def read_bytes(path: str | os.PathLike, what: str = "file", limit: int = MAX_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; UserError otherwise."""
    try:
        return read_regular(path, limit)
    except OSError as exc:
        _refuse(exc, path, what, limit)


# A path that is a link whose target cannot be reached: said so, not "does not exist" nor the OS's
# "Too many levels of symbolic links".
DEAD_LINK = "is a link that leads to no file (its target is missing, or links loop)"


def _refuse(exc: OSError, path: str | os.PathLike, what: str, limit: int):
    shown = os.fsdecode(path)
    if os.path.islink(path) and (isinstance(exc, FileNotFoundError) or exc.errno == errno.ELOOP):
        raise UserError(f"{what} {shown} {DEAD_LINK}.") from None
    if isinstance(exc, FileNotFoundError):
        raise UserError(f"{what} {shown} does not exist.") from None
    if isinstance(exc, NotRegular):
        raise UserError(f"{what} {shown} is {exc.strerror}: kohya-tuner reads only regular files "
                        "(reading a pipe or a device would wait or never end).",
                        "Pass the file itself (a saved copy, not a pipe, device or folder).") from None
    if isinstance(exc, TooLarge):
        raise UserError(f"{what} {shown} is {exc.strerror}; kohya-tuner reads files of up to "
                        f"{limit:,} bytes (a config or dataset file is a few kilobytes).",
                        "Check that this is the file you meant.") from None
    raise UserError(f"Cannot read {what} {shown}: {exc.strerror or exc}.") from None


def read_text(path: str | os.PathLike, what: str = "file", limit: int = MAX_BYTES) -> str:
    """The text of a regular file: NUL-free, UTF-8 (undecodable bytes replaced). A leading
    byte-order mark is kept as U+FEFF: JSON and command-line readers drop it, while the TOML
    reader refuses it as sd-scripts' parser would fail on it."""
    data = read_bytes(path, what, limit)
    if b"\x00" in data[:4096]:
        head = data[:4096]
        if data[:2] in (b"\xff\xfe", b"\xfe\xff") or head[1::2].count(0) > len(head) // 4 \
                or head[0::2].count(0) > len(head) // 4:
            raise UserError(f"{what} {os.fsdecode(path)} is saved as UTF-16 (what Windows PowerShell's > and some "
                            "editors write); sd-scripts and the kohya_ss GUI read UTF-8 only.",
                            "Save it as UTF-8 without a byte-order mark (an editor's encoding menu offers it).")
        raise UserError(f"{what} {os.fsdecode(path)} is a binary file, not text.")
    return data.decode("utf-8", errors="replace")


def check_lines(text: str, what: str, limit: int = MAX_LINE) -> None:
    """Refuse a text with a line longer than `limit` characters."""
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        if end - start > limit:
            line = text.count("\n", 0, start) + 1
            raise UserError(f"{what}: line {line} is {end - start:,} characters long; kohya-tuner reads TOML lines of "
                            f"up to {limit:,} (sd-scripts' parser slows to minutes on such lines).",
                            "Check that this is the file you meant.")
        start = end + 1


def check_values(doc: Any, what: str, depth: int = MAX_DEPTH) -> None:
    """Refuse what a parsed file holds that sd-scripts cannot: nesting deeper than `depth`,
    NaN/inf, integers beyond 64 bits, keys that are not text. Iterative, so any depth is safe."""
    stack: list[tuple[Any, str, int]] = [(doc, "", 0)]
    while stack:
        value, key, level = stack.pop()
        if level > depth:
            raise UserError(f"{what}: {key or 'the document'} is nested more than {depth} levels deep; "
                            "no sd-scripts setting is.")
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(k, str):
                    raise UserError(f"{what}: the key {k!r} is not text.")
                stack.append((v, f"{key}.{k}" if key else k, level + 1))
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                stack.append((v, f"{key}[{i}]", level + 1))
        else:
            check_number(key, value, what)


def check_number(key: str, value: Any, what: str) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{what}: {key}: {value} is not a finite number (NaN, inf, or too large, like 1e400).",
                        f"Give {key} an ordinary number.")
    if isinstance(value, int) and not -INT_LIMIT <= value < INT_LIMIT:
        raise UserError(f"{what}: {key}: an integer of {len(str(abs(value)))} digits, beyond the 64-bit range "
                        "sd-scripts and torch use.", f"Give {key} an ordinary number.")


def parse_guard(fn, text: str, what: str):
    """Run a parser on untrusted text, turning the errors of extreme input into UserError:
    RecursionError (deep nesting), OverflowError, and the ValueError of an integer past
    Python's digit limit, which names the key it belongs to like any other number too large."""
    try:
        return fn(text)
    except RecursionError:
        raise UserError(f"{what} is nested too deeply to read; no sd-scripts file is.") from None
    except OverflowError as exc:
        raise UserError(f"{what} holds a number too large to read: {exc}.") from None
    except ValueError:
        long_integer(text, what)
        raise


def long_integer(text: str, what: str) -> None:
    """Refuse, naming its key and line, an integer too long for int() (Python's digit
    limit, 4,300 by default): every parser fails on one with a message about Python."""
    limit = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 0
    if not limit:
        return
    found = re.search(r"\d{%d,}" % (limit + 1), text)
    if found is None:
        return
    start = text.rfind("\n", 0, found.start()) + 1
    before = text[start:found.start()]
    key = re.search(r'([A-Za-z0-9_.\-]+)"?\s*[=:]\s*[-+\[\s]*$', before)
    name = key.group(1) if key else "a value"
    digits = len(found.group())
    line = f" (line {text.count(chr(10), 0, start) + 1})" if "\n" in text.rstrip("\n") else ""
    raise UserError(f"{what}: {name}{line}: an integer of {digits:,} digits, "
                    "beyond the 64-bit range sd-scripts and torch use.", f"Give {name} an ordinary number.")


def check_dataset_shape(data: dict[str, Any], where: str) -> None:
    """The sections sd-scripts' dataset schema requires to be tables or lists of tables; a
    wrong type (`subsets = 5`) is named here rather than failing later in whatever reads it."""
    table(data.get("general", {}), "general", where)
    datasets = tables(data.get("datasets", []), "datasets", where)
    for i, ds in enumerate(datasets):
        tables(ds.get("subsets", []), f"datasets[{i}].subsets", where)


def table(v: Any, key: str, where: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise UserError(f"{where}: {key} must be a table (a [section]), not {type(v).__name__} {str(v)[:40]!r}.")
    return v


def tables(v: Any, key: str, where: str) -> list[dict[str, Any]]:
    if not isinstance(v, list):
        raise UserError(f"{where}: {key} must be a list of tables ([[{key}]]), not {type(v).__name__} "
                        f"{str(v)[:40]!r}.")
    for i, item in enumerate(v):
        table(item, f"{key}[{i}]", where)
    return v
