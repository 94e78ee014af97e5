"""What the parser holds while a record, an OOM message or a traceback is still open.

At most one of each at a time, each bounded, so that memory stays flat on any log.
"""

from __future__ import annotations

import re

from kohya_tuner.logparse import frames as F
from kohya_tuner.logparse import patterns as P

# One physical line is cut here; a log line this long is binary noise or a runaway print.
MAX_LINE = 65536
_MAX_RECORD = 16384
_MAX_FRAMES = 300


class _RichRecord:
    __slots__ = ("level", "parts", "width", "line_width", "last", "size")

    def __init__(self, level: str, first: str, width: int | None, line_width: int):
        self.level = level
        self.width = width
        self.line_width = line_width
        self.parts: list[str] = []
        self.last: str | None = None
        self.size = 0
        self.add(first, line_width)

    def add(self, fragment: str, raw_width: int) -> None:
        frag = fragment.strip()
        if not frag:
            self.last = None
            return
        if self.size > _MAX_RECORD:
            return
        self.size += len(frag)
        last = self.last
        if last is not None and self.width and P.cell_len(last) == self.width:
            # A full line followed by more text may be one long word (a path) folded in two.
            # Rich pads every line to the console width and starts a long word on a fresh line,
            # so its folds are lines without a space. Wrappers that do not pad (textwrap) fill
            # the line with the word's beginning: a fold there is a word too long to have been
            # moved to the next line whole.
            if raw_width == self.line_width:
                fold = " " not in last
            else:
                last_tok = last.rsplit(" ", 1)[-1]
                first_tok = frag.split(" ", 1)[0]
                fold = P.cell_len(last_tok) + P.cell_len(first_tok) > self.width
            if fold:
                self.parts[-1] += frag
                self.last = frag
                return
        self.parts.append(frag)
        self.last = frag

    def text(self) -> str:
        return " ".join(self.parts)


class _PendingOom:
    __slots__ = ("parts", "evidence", "first", "rank")

    def __init__(self, text: str, evidence: F.FrameEvidence | None, rank: int | None = None):
        self.parts = [text]
        self.evidence = evidence
        self.first = text
        self.rank = rank  # the `[rankN]:` prefix of its first line, if any

    def text(self) -> str:
        return " ".join(self.parts)

    def done(self) -> bool:
        return bool(P.OOM_DONE_RE.search(self.text()))


# The rest of a Rich frame row folded after its path's colon: "5 in <module>".
_FOLDED_TAIL_RE = re.compile(r"\d+ in(?: \S|\s*$)")


class _Traceback:
    __slots__ = ("frames", "explicit", "boxed", "headless", "lines", "bar", "chained", "wrapped")

    def __init__(self, explicit: bool, boxed: bool, headless: bool = False):
        self.frames: list[str] = []
        # The update of a bar with no description printed right before it (parser: _bar_before).
        self.bar = None
        # explicit: its "Traceback (most recent call last)" header was seen; boxed: drawn by Rich;
        # headless: it starts at a frame line, the header cut off.
        self.explicit = explicit
        self.boxed = boxed
        self.headless = headless
        self.lines = 0
        # The error line it was raised while handling (a chained traceback), None when not chained.
        self.chained: str | None = None
        # A Rich box a narrow console wrapped: its rows' right edges on lines of their own.
        self.wrapped = False

    def add(self, line: str) -> None:
        self.lines += 1
        if self.boxed and self.frames and self.frames[-1].endswith(".py:") and _FOLDED_TAIL_RE.match(line):
            # Rich folded a frame row right after the path's colon ("…/__init__.py:" / "5 in <module>").
            self.frames[-1] += line
            return
        if len(self.frames) < _MAX_FRAMES:
            self.frames.append(line)

    @classmethod
    def headless_at(cls, lines: tuple[str, ...]) -> _Traceback:
        """A traceback whose header a paste cut, opened by `lines` (headless_opening's)."""
        tb = cls(explicit=False, boxed=False, headless=True)
        for line in lines:
            tb.add(line)
        return tb


# Python 3.11 and later mark the failing part of a frame's source line with a row of carets
# ("^^^^", "~~~~^^^^~~"), and only inside a traceback.
CARETS_RE = re.compile(r"[~^]*\^[~^]*$")


def headless_opening(s: str, before: str | None) -> tuple[str, ...] | None:
    """The lines that open a traceback whose header a paste cut, else None: a frame line, the
    line Python prints for a frame repeated by recursion, or a source line (`before`, the line
    right before, indented) with its caret row under it."""
    if P.FRAME_LINE_RE.match(s) or s.startswith("[Previous line repeated "):
        return (s,)
    if before is not None and s[0] in "^~" and len(s) >= 3 and CARETS_RE.match(s):
        return (before, s)
    return None


# A Rich traceback box without its header still counts when it shows a frame ("file.py:12 in f").
# Rich folds a long path: the function name ("in │ init_process_group") or the whole "in f" goes
# to the next row, and the path's start to the row before (a row may begin "py:45 in main").
BOX_FRAME_RE = re.compile(r"(?:\.|^)py:\d+(?: in(?: [\w<]|\s*$)|\s*$)")


def last_frame(tb: _Traceback) -> str:
    """The frame a cut traceback ended in, for its message. In a Rich box the rows are source
    lines ("│    79 │") as often as frames: take its last `file.py:N in func` row, never a
    bare line number."""
    rows = [f.strip() for f in tb.frames if f.strip() and f.strip()[0] != "^"]
    if tb.boxed:
        framed = [r for r in rows if BOX_FRAME_RE.search(r)]
        if framed:
            return framed[-1]
    return next((r for r in reversed(rows) if any(c.isalpha() for c in r)), "")
