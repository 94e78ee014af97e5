"""One output-encoding policy for every command.

A redirected stdout on Windows is cp1252; `LANG=C` gives ASCII; a path argument may hold
bytes that are not UTF-8 (Python keeps them as lone surrogates). None of that may end a
command: a character the stream cannot carry is replaced, never raised as
UnicodeEncodeError, and JSON is written with ASCII escapes when the stream is not UTF-8 so
it stays exact.
"""

from __future__ import annotations

import codecs
import io
import sys


def _is_utf8(stream) -> bool:
    enc = getattr(stream, "encoding", None) or ""
    try:
        return codecs.lookup(enc).name == "utf-8"
    except LookupError:
        return False


def apply() -> None:
    """Make sys.stdout and sys.stderr replace what they cannot encode (idempotent)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name, None)
        if isinstance(stream, io.TextIOWrapper) and stream.errors != "replace":
            try:
                stream.reconfigure(errors="replace")
            except (ValueError, OSError):  # a closed or detached stream: nothing to print to
                pass


def json_ascii() -> bool:
    """Whether JSON on stdout must escape non-ASCII (the stream cannot carry it exactly)."""
    return not _is_utf8(sys.stdout)
