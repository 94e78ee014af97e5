"""What a capture tool or a paste did to every line of a log, found in its first bytes and undone
once, before the parser sees the text: a prefix on every line (journalctl's `May 01 12:00:00 host
python3[42]: `, a time and a bar `2024-05-01 12:00:00 | `, a bare time, docker's `-t` time, a line
number from `cat -n`, `12: ` or `12 | `) and an indent common to every line (a markdown code block,
a tab). Pure functions and one small streaming filter.

A prefix class is only taken off when nearly every non-blank line of the head carries it, traceback
lines included: the trainer's own output never looks like that (Rich prints its time column on a
record's first line only, a traceback has none), so a log's own layout is never cut.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TIME = r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?"
_ZONE = r"(?:Z|[+-]\d\d:?\d\d)"
# (name, what the prefix of one line looks like). A capture tool writes its prefix before a blank
# line too, maybe with the separator's trailing space cut by an editor: `$` ends those.
_CLASSES = (
    # journalctl's default and -o short-iso: time, host, the process's name and pid (the pid tells it
    # from a docker time before a line such as "caching latents: …").
    ("journal", r"(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d|" + _TIME + _ZONE + r") [\w.\-]+ [^\s:\[\]]+\[\d+\]:(?: |$)"),
    ("docker", r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?" + _ZONE + r"(?: |$)"),
    ("time_pipe", _TIME + _ZONE + r"? \|(?: |$)"),
    # (Not before "- ": ComfyUI's console and logging's "%(asctime)s - ", which the cleaning knows.)
    ("time", _TIME + r"(?: (?![-|] )|$)"),
    # A markdown quote ("> "; a quoted blank line is a bare ">"), which the parser also reads line by
    # line, but here the indent or the prefix of the text inside it is found too.
    ("quote", r">(?: |$)"),
    ("lineno_tab", r" *\d+\t"),
    ("lineno_colon", r" *\d+:(?: |$)"),
    ("lineno_pipe", r" *\d+ \|(?: |$)"),
)
_CLASS_RES = tuple((name, re.compile(rx)) for name, rx in _CLASSES)
_NUMBERED = frozenset({"lineno_tab", "lineno_colon", "lineno_pipe"})
# A level right after a time: the time is the head of the program's own records, which the parser
# reads, not a capture tool's: "2023-07-12 02:50:34 | ERROR | stderr | " (a logger's columns between
# bars), Rich's padded level column, logging's "%(asctime)s %(levelname)s". (Not Python's bare
# "INFO:name:", which has no time of its own, nor vLLM's "ERROR 07-30 18:15:55 engine.py:400]", a
# level with its own time after it.)
_LEVELS = r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|SUCCESS|TRACE)"
_OWN_HEAD = {
    "time_pipe": re.compile(_LEVELS + r" *\|"),
    "time": re.compile(r"(?:[|\-] )?" + _LEVELS + r"(?:$| +(?!\d\d-\d\d ))"),
}
# A markdown fence around a pasted log has no prefix and no indent of its own.
FENCE_RE = re.compile(r"[ \t]*(?:```+|~~~+)[\w+\-. ]*[ \t]*")
# Share of the head's non-blank lines that must carry a prefix class.
_NEARLY_ALL = 0.95
# Longer common indents are Rich's blank time column (a paste that starts inside a record), not a
# code block's.
_MAX_INDENT = 8
# No prefix of these classes is longer: a line's start split between two reads is held back this long.
_MAX_PREFIX = 96


@dataclass(frozen=True)
class InputForm:
    """The prefix class (None: no prefix) and the common indent taken off every line."""

    prefix: str | None
    indent: str

    def pattern(self) -> re.Pattern:
        rx = dict(_CLASSES)[self.prefix] if self.prefix else ""
        return re.compile(r"(?m)^(?:" + rx + ")" + (f"(?:{re.escape(self.indent)})?" if self.indent else ""))


def _lines(head: str, complete: bool) -> list[str]:
    lines = head.split("\n")
    if not complete and len(lines) > 1:
        lines.pop()  # cut by the end of the head
    return [ln.rstrip("\r") for ln in lines if ln.strip() and not FENCE_RE.fullmatch(ln.rstrip("\r"))]


def _prefix_class(lines: list[str]) -> tuple[str, re.Pattern] | None:
    need = int(len(lines) * _NEARLY_ALL + 0.999)
    for name, rx in _CLASS_RES:
        hits = [m for m in map(rx.match, lines) if m]
        if len(hits) < need:
            continue
        if name in _NUMBERED:
            numbers = [int(m.group(0).strip(" \t:|")) for m in hits]
            if any(b <= a for a, b in zip(numbers, numbers[1:])):
                continue  # not a line count: a rank or a worker's number (the cleaning strips those)
        own = _OWN_HEAD.get(name)
        if own and 2 * sum(1 for m in hits if own.match(m.string, m.end())) >= len(hits):
            continue
        return name, rx
    return None


def _common_indent(lines: list[str]) -> str:
    first = lines[0]
    indent = first[: len(first) - len(first.lstrip(" \t"))]
    for ln in lines[1:]:
        if not indent:
            break
        i = 0
        while i < len(indent) and i < len(ln) and ln[i] == indent[i]:
            i += 1
        indent = indent[:i]
    return indent if len(indent) <= _MAX_INDENT else ""


def sniff_form(head: str, complete: bool = False) -> InputForm | None:
    """What to take off every line of a log whose first characters are `head` (`complete`: the whole
    log), or None when its lines are as the trainer wrote them."""
    lines = _lines(head, complete)
    if not lines:
        return None
    found = _prefix_class(lines)
    prefix = None
    if found:
        prefix, rx = found
        lines = [ln[m.end():] if (m := rx.match(ln)) else ln for ln in lines]
        lines = [ln for ln in lines if ln.strip()]
    # One indented line alone is as likely a frame's source row or a record cut to another indent.
    indent = _common_indent(lines) if len(lines) > 1 else ""
    if prefix is None and not indent:
        return None
    return InputForm(prefix, indent)


class FormFilter:
    """Takes a form's prefix off every line of text fed in chunks of any size (a chunk may end
    mid-line, or inside a prefix)."""

    def __init__(self, form: InputForm) -> None:
        self._rx = form.pattern()
        self._carry = ""
        # The text so far ended mid-line: the next chunk's start is no line's start.
        self._mid = False

    def feed(self, text: str, final: bool = False) -> str:
        if self._carry:
            text = self._carry + text
            self._carry = ""
        if not text:
            return text
        last = text.rfind("\n") + 1
        if not final and len(text) - last < _MAX_PREFIX:
            # A line's start, maybe a prefix cut in two: held for the next chunk.
            self._carry = text[last:]
            text = text[:last]
            if not text:
                return text
        mid, self._mid = self._mid, text[-1:] != "\n"
        if not mid:
            return self._rx.sub("", text)
        nl = text.find("\n") + 1
        if nl == 0:
            return text
        return text[:nl] + self._rx.sub("", text[nl:])
