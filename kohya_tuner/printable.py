"""Text from the outside world (file names, log lines, values) made safe to print.

A file name may hold terminal escape sequences (ESC, CSI, OSC ...) that retitle, recolour
or clear the terminal when printed raw. Every printed path goes through `printable`, which
writes each control character as a visible `\\xNN` escape; `\\n` and `\\t` stay only where
the caller allows them (a message, not a name)."""

from __future__ import annotations

import re

# C0 controls, DEL, C1 controls (0x9b alone is a CSI on many terminals), and the bidi
# overrides that make a name read differently from what it is.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
CONTROL = _CONTROL  # what a printed value must never carry raw
_CONTROL_KEEP_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _esc(m: re.Match) -> str:
    o = ord(m.group())
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


def printable(text: str, keep_lines: bool = False) -> str:
    """`text` with control characters shown as escapes; lone surrogates (undecodable bytes of
    a file name) become U+FFFD."""
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return (_CONTROL_KEEP_LINES if keep_lines else _CONTROL).sub(_esc, text)


def short_repr(value: object, limit: int = 80) -> str:
    """A value's repr for a message, cut to about `limit` characters with its length said:
    a 5,000-digit number or a megabyte string must not become the whole paragraph."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit - 20]}… ({len(text):,} characters)"
