"""Cleaning one physical line of a log: colour codes and the prefixes other tools put before
each line (a timestamp, a level in brackets, a rank, a launcher's host name). Pure functions.
"""

from __future__ import annotations

import re
import unicodedata



_ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]")
# Colour codes whose ESC byte was lost when a user pasted a log ("[32mINFO[0m").
_BARE_SGR_RE = re.compile(r"\[(?:\d{1,3}(?:;\d{1,3})*)?m")

# Prefixes other tools put before each line. Rich's own time column ("2026-01-01 12:00:00 INFO")
# is not among them: it is how sd-scripts records start.
_PREFIX_RE = re.compile(
    r"(?:"
    r"\[\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\]"  # [2024-09-18 08:19:50]
    r"|\[(?:INFO|DEBUG|WARNING|WARN|ERROR|CRITICAL|FATAL|STDOUT|STDERR|stdout|stderr) *\]"  # [INFO], "[stderr   ]"
    r"|\[(?:rank|default)\d+\]:"  # [rank1]: / torchrun's [default0]:
    r"|\[(?:RANK|Rank|rank) \d+\](?= )"  # a launcher's rank tag: "[RANK 0] "
    r"|\[[A-Za-z][\w.]*(?:-[\w.]+)+\](?= )"  # a wrapper's hyphenated tool name: "[sd-scripts] "
    r"|\[[A-Z][A-Z0-9_]{1,15}\](?= )"  # a wrapper's tag in capitals for the process it relays: "[TRAIN] "
    r"|\[\d{2}:\d{2}:\d{2}(?:[.,]\d+)?\](?= )"  # a time alone: "[14:38:51] "
    r"|\[[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}\](?= )"  # a job's or a pod's id: "[eef6d770-c7b4-…] "
    r"|\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)? -(?= |$)"  # ComfyUI's console: "2024-12-04T15:03:20.583535 - "
    r"|\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d+: [IWEF] [\w./\\-]+:\d+\] ?"  # TensorFlow's C++ log: "…30.487137: E x/y.cc:485] "
    r"|\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}[.,]\d{3,}(?:Z|[+-]\d{2}:?\d{2})?(?= )"  # 2024-06-30 23:45:34,053
    r"|\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:Z|[+-]\d{2}:?\d{2})(?= )"  # docker-style ISO time
    r"|\d{2}/\d{2}/\d{4} \d{2}:\d{2}:\d{2}(?= - | \d{1,3}:[A-Z]+: )"  # accelerate's get_logger: 08/08/2024 04:37:22 - INFO -
    r"|\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?= - )"  # "%(asctime)s - " with whole seconds: 2025-01-03 23:03:35 - [Sana] -
    r"|\d{1,3}:(?=(?:DEBUG|INFO|WARNING|ERROR|CRITICAL): )"  # a rank before a level: "0:INFO: …"
    r"|\d{2}/\d{2}/\d{4} \d{1,2}:\d{2}:\d{2} [AP]M(?= )"  # logging's "%m/%d/%Y %I:%M:%S %p": 06/29/2023 03:28:28 AM
    r"|\d{2}:\d{2}:\d{2}-\d{6}(?= +(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\b)"  # the kohya_ss GUI's: 09:55:45-597461 INFO
    r") ?"
)


# A level padded before a bar is a record's head (a loguru format), not a service's name.
_LEVELS = frozenset({"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", "SUCCESS", "TRACE"})
# glog's prefix, as torch's C++ side and torch.distributed's launcher print it: "W0902 00:40:01.940000
# 133343758611968 torch/distributed/run.py:779] message" (level letter, month and day, time, thread, source).
_GLOG_LEVELS = "IWEF"
_GLOG_RE = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d\d(?:\.\d+)? +\d+ [\w./\\-]+:\d+\] ?")
_HOST_RE = re.compile(r"[A-Za-z0-9][\w.\-]*[A-Za-z0-9]")
_BAR_AFTER_RE = re.compile(r" *\d{1,3}%\|")


def host_prefix_end(line: str) -> int:
    """Where a launcher's host or worker name before the line ends ("mpi-…-launcher: ", pdsh's
    "node01: ", DeepSpeed's "worker-0: ", "10.0.0.5: ", docker compose's "kohya-1  | "), else 0. The name is one token of
    letters, digits, dots, dashes and underscores holding a digit or a dash, so that an exception
    name ("RuntimeError: …") or a script ("train.py: error: …") is never taken for one."""
    i = line.find(": ", 1, 64)
    end = i + 2
    # docker compose's "service-1  | " (padded to the longest service name).
    j = line.find(" | ", 1, i if i > 0 else 64)
    if j > 0:
        i, end = j, j + 3
    elif i < 0:
        return 0
    token = line[:i].rstrip(" ")
    # A service name padded before its bar ("trainer  | ", compose's alignment) needs no dash or
    # digit: one space before a bar is how tables and other records put it.
    padded = j > 0 and line[j - 1] == " " and token not in _LEVELS
    if not (padded or "-" in token or any(ch.isdigit() for ch in token)) or token.endswith(".py"):
        return 0
    if not _HOST_RE.fullmatch(token):
        return 0
    if not ("-" in token or "." in token or "_" in token) and not token.islower() and not token.isupper() \
            and not token.isdigit():
        # A class named in mixed case before its own figures ("UNet2DConditionModel: 64, 8, 768"), not a host.
        return 0
    if _BAR_AFTER_RE.match(line, end):
        # "my-job-v1:   0%|…": a bar's description (ai-toolkit names its bar after the job), not a host.
        return 0
    return end


def may_have_prefix(line: str) -> bool:
    """Whether clean() could find anything to take off a non-empty line (a cheap test first)."""
    c = line[0]
    return (c == "[" or c.isdigit() or "\x1b" in line or "[0m" in line
            or (c in _GLOG_LEVELS and line[1:2].isdigit()))


def strip_ansi(line: str) -> str:
    """The line without colour codes, also those that lost their ESC byte in a paste."""
    if "\x1b" in line:
        line = _ANSI_RE.sub("", line)
    if "[0m" in line:
        line = _BARE_SGR_RE.sub("", line)
    return line


def clean(line: str) -> str:
    """One physical line without colour codes and without other tools' prefixes."""
    line = strip_ansi(line)
    if line[:1] in _GLOG_LEVELS and line[1:2].isdigit():
        m = _GLOG_RE.match(line)
        if m:
            line = line[m.end():]
    if line[:1].isalnum():
        end = host_prefix_end(line)
        if end:
            line = line[end:]
    for _ in range(4):
        if not line or not (line[0] == "[" or line[0].isdigit()):
            break
        m = _PREFIX_RE.match(line)
        if not m:
            break
        line = line[m.end():]
    return line


# Rich's traceback box drawn in ASCII, as Rich draws it on a console that cannot encode its box
# glyphs (a legacy Windows code page): "+--- Traceback (most recent call last) ---+", "| … |" rows,
# "> 176 |" for "❱ 176 │", then "+-----+".
_ASCII_BOX_TOP_RE = re.compile(r"\s*\+-{3,} Traceback \(")
_ASCII_MARK_RE = re.compile(r"(│\s*)> (?=\s*\d+ │)")
# A row of such a box whose top scrolled away: a source row ("|   126 |   code   |", "| > 129 |") or a
# frame's head ("| D:\\kohya_ss\\train_network.py:250 in train   |"), padded to the box's width.
_ASCII_ROW_RE = re.compile(r"\|(?: > |   )\s*\d+ \||\| \S.*\.py:\d+ in \S+ +\|\s*$")


def ascii_box_row(line: str, inside: bool) -> tuple[str, bool]:
    """A line of Rich's ASCII traceback box in Rich's own glyphs, which the parser reads, and whether
    the box goes on after it (`inside`: it went on before)."""
    s = line.lstrip()
    c = s[:1]
    if c == "+" and (inside or _ASCII_BOX_TOP_RE.match(line)):
        top = not inside or not s.rstrip().strip("+-") == ""
        line = line.replace("-", "─")
        i, j = line.find("+"), line.rfind("+")
        if top:
            return line[:i] + "╭" + line[i + 1:j] + "╮" + line[j + 1:] if j > i else line[:i] + "╭" + line[i + 1:], True
        return line[:i] + "╰" + line[i + 1:j] + "╯" + line[j + 1:] if j > i else line, False
    if c == "|" and (inside or (len(s) >= 40 and s.rstrip()[-1:] == "|" and _ASCII_ROW_RE.match(s))):
        return _ASCII_MARK_RE.sub(r"\1❱ ", line.replace("|", "│"), 1), True
    return line, False


# What a wrapper puts before the output it relays from the trainer's process: its name in
# brackets, a stream or process tag, or both ("[My Node] TRAINER: ", "[Trainer] ", "stderr: ").
_RELAY_RE = re.compile(r"(?:\[[^\]\n]{1,64}\] ?(?:[A-Za-z][\w\-]{0,31}: )?|[A-Za-z][\w\-]{0,31}: )(?=Traceback \(most recent)")


def strip_relay(line: str, relay: str | None) -> tuple[str, str | None]:
    """The line without the prefix a wrapper relaying the trainer's output puts before each of
    its lines, and that prefix: found before a traceback's header, then stripped from every
    later line that starts with it (the same stream)."""
    if relay is not None and line.startswith(relay):
        return line[len(relay):], relay
    m = _RELAY_RE.match(line) if line[:1].isalpha() or line[:1] == "[" else None
    if m is None:
        return line, relay
    return line[m.end():], m.group(0)


def cell_len(text: str) -> int:
    """Terminal columns `text` takes (East Asian wide characters take two)."""
    if text.isascii():
        return len(text)
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)
