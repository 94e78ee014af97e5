"""Log text whose newlines were lost: pasted into a markdown quote or a one-line field, copied
from a console that wrapped nothing, or re-logged record by record onto one line. What was
several lines comes back as several, each then read as usual:

- several log records on one line: each record's head after the line's start (a `YYYY-MM-DD
  HH:MM:SS` time, bracketed or not, then its level, maybe after logger names or bracketed tags)
  starts a line of its own, once text other than prefixes comes before it;
- torchrun's `[rankN]: ` before every line of its output, several times on one line;
- a Python warning run on after other text (`… file.py:N: UserWarning: …`): its path starts a line;
- a Python traceback on one line: its header, `During handling…`/`The above exception…`, each
  `File "…", line N, in func` and the source after it, and the exception line, in the form
  Python's `traceback` module prints (frames indented two spaces, sources four).

A line with a record head only at its start, a single rank prefix or a single frame is left
alone: that is how an intact log looks.
"""

from __future__ import annotations

import re

from kohya_tuner.logparse.cleaning import clean
from kohya_tuner.logparse.patterns import TRACEBACK_HEAD

# A record's head: its time, then its level, maybe after logger names or bracketed tags
# ("2024-06-30 23:45:34,053 - INFO", "[2026-01-28 09:07:29,344] [INFO]", "2025-11-07 21:58:09,277 -
# SimpleTuner - INFO - ", "2024-06-30 23:45:34 INFO", "2024-06-30 23:45:34.123 | ERROR |").
_RECORD_HEAD_RE = re.compile(
    r"(?:(?<=\s)|^)\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[,.]\d+)?\]?"
    r"(?=\s+(?:- )?(?:[\w.\-]+ - |\[[^\]\n]{0,40}\] )*(?:\[|- |\| )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\b)"
)
_RANK_RE = re.compile(r"\[rank\d+\]:\s?")
# The pieces of a traceback that start a line of their own.
_TB_PIECE_RE = re.compile(
    r"Traceback \(most recent call last\):"
    r"|During handling of the above exception, another exception occurred:"
    r"|The above exception was the direct cause of the following exception:"
    r'|File "[^"\n]+", line \d+(?:, in (?:<\w+>|[\w.]+)?)?'
)
# The exception line at the end of a traceback: a class name ending in Error, Exception, … then
# ":" or the end ("torch.OutOfMemoryError: CUDA out of memory", "KeyboardInterrupt").
_EXC_RE = re.compile(
    r"(?:^|(?<=\s))(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Interrupt|Exit)(?=:\s|:$|$)"
)
# A Python warning printed by the other stream onto the end of a line ("… train_util.py:779 C:\\venv\\…\\
# eval_frame.py:838: UserWarning: …"): its path starts a line of its own.
_RUN_ON_WARNING_RE = re.compile(r"(?<=\s)(?:[A-Za-z]:)?[^\s:]+\.py:\d+: (?:[\w.]+\.)?[A-Z]\w*Warning: ")
# Python's markers under a source line ("^^^^^", "~~~~^^^^").
_CARETS_RE = re.compile(r"(?:^|\s)[~^]{2,}(?=\s|$)")


def unflatten(line: str) -> list[str] | None:
    """The lines a line with lost newlines held, or None when it is one line."""
    if len(line) < 80:
        return None
    if "Warning: " in line:
        m = _RUN_ON_WARNING_RE.search(line)
        if m is not None and line[:m.start()].strip():
            head, rest = line[:m.start()].rstrip(), line[m.start():]
            return (unflatten(head) or [head]) + (unflatten(rest) or [rest])
    heads = []
    if line.count(":") >= 4 and ("INFO" in line or "ERROR" in line or "WARNING" in line or "DEBUG" in line):
        heads = [m.start() for m in _RECORD_HEAD_RE.finditer(line)]
    if heads and heads[-1] > 0:
        cuts = [0] + [h for h in heads if h > 0]
        pieces: list[str] = []
        carry = ""
        for a, b in zip(cuts, cuts[1:] + [len(line)]):
            piece = carry + line[a:b]
            # A tool's own time and level before the trainer's record ("[time] [INFO] 2024-… - INFO -
            # message") are one line's prefixes, not a record of their own.
            carry = piece if not clean(piece).strip() else ""
            if not carry:
                pieces.append(piece.rstrip())
        if carry:
            pieces.append(carry.rstrip())
        if len(pieces) >= 2:
            out: list[str] = []
            for piece in pieces:
                out.extend(unflatten(piece) or [piece])
            return [p for p in out if p.strip()]
    ranks = list(_RANK_RE.finditer(line)) if line.count("[rank") >= 2 else []
    if len(ranks) >= 2:
        prefix = ranks[0].group(0).rstrip() + " "
        head = line[:ranks[0].start()].rstrip()
        body = _RANK_RE.sub(" ", line[ranks[0].start():])
        lines = _traceback_lines(body) or [p.strip() for p in _RANK_RE.split(line[ranks[0].start():]) if p.strip()]
        return ([head] if head else []) + [prefix + x for x in lines]
    return _traceback_lines(line)


def _traceback_lines(text: str) -> list[str] | None:
    """A traceback flattened onto one line, back in Python's own layout; None when the text holds
    no traceback header with a frame after it, nor two frames."""
    if 'File "' not in text:
        return None
    i = text.find(TRACEBACK_HEAD)
    pieces = list(_TB_PIECE_RE.finditer(text))
    frames = [m for m in pieces if m.group(0).startswith("File ")]
    if not frames or (i < 0 and len(frames) < 2) or (i >= 0 and frames[-1].start() < i):
        return None
    out: list[str] = []
    if text[:pieces[0].start()].strip():
        out.append(text[:pieces[0].start()].rstrip())
    for k, m in enumerate(pieces):
        word = m.group(0)
        end = pieces[k + 1].start() if k + 1 < len(pieces) else len(text)
        rest = _CARETS_RE.sub(" ", text[m.end():end]).strip()
        if not word.startswith("File "):
            out.append(word)
            if rest:
                out.append(rest)
            continue
        out.append("  " + word)
        if not rest:
            continue
        exc = _EXC_RE.search(rest) if k + 1 == len(pieces) or not pieces[k + 1].group(0).startswith("File ") else None
        source, tail = (rest[:exc.start()].strip(), rest[exc.start():]) if exc else (rest, "")
        if source:
            out.append("    " + source)
        if tail:
            out.append(tail)
    return out
