"""The streaming parser: text chunks in, typed events out.

`LogParser.feed` takes whatever the trainer wrote, in chunks of any size (a chunk may end
mid-line, mid-`\\r\\n`, mid-record); `finish` flushes what is left. Feeding a text in one
piece or in any split gives the same events. The parser holds at most one line, one Rich
record, one OOM message and one traceback at a time, so memory stays flat on huge logs.

Layers, bottom up:
  physical lines   split on \\n, \\r\\n and the bare \\r of tqdm updates; ANSI codes and other
                   tools' prefixes ([timestamp] [INFO], [rank1]:) removed; a tqdm bar glued to
                   the next output is split off
  logical lines    a Rich log record wrapped over several lines (80 columns on a pipe) is
                   joined back, mid-word folds included
  events           progress, milestones, saves, resume, OOM with figures, other failures,
                   `model saved.`, the launcher's exit status
"""

from __future__ import annotations

from collections import deque

import re

from kohya_tuner.logparse import patterns as P
from kohya_tuner.logparse import progress as PR
from kohya_tuner.logparse.barruns import BarRuns
from kohya_tuner.logparse.inputform import FENCE_RE, FormFilter, sniff_form
from kohya_tuner.logparse.failures import CHAIN_WORDS, Failures, crash_line
from kohya_tuner.logparse.unflatten import unflatten
from kohya_tuner.logparse.milestones import Milestones
from kohya_tuner.logparse.recordnames import RecordNames
from kohya_tuner.logparse.events import (
    BAR_REDRAWN, JOB_RECORD, EpochStart, Event, Exited, Failure, Finished, Milestone, Oom, Processes, Progress, Restart,
    Resumed, Saved, TotalSteps,
)

from kohya_tuner.logparse.records import MAX_LINE, _PendingOom, _RichRecord, _Traceback
from kohya_tuner.logparse.records import headless_opening

_RICH_INDENT = " " * P.RICH_MESSAGE_COLUMN
_LEVEL_INITIALS = frozenset("DIWEC")
_FENCES = ("```", "~~~")
# First characters of a fence and of Rich's traceback box drawn in ASCII.
_RARE_STARTS = frozenset("`~+|")
# Logical lines at the start of each run searched for the wrapper and the model family (the
# command line, the model loading); after that only tracebacks and warnings are. A log names
# its tool and model early, and searching every line of a 200 MB log would cost a third of
# the time it takes to read it.
_NAME_LINES = 5000
# The log's first non-blank lines that, met again word for word in this order, begin a second copy
# of the output (Restart). Five lines and 80 characters: fewer recur within one run (a warning
# printed every epoch, a rank's traceback after another's), so an opening of a traceback, or one
# this short, is never taken for a run's start.
_OPENING_LINES = 5
# accelerate keeps 64 chunks of 8 KiB of the trainer's stderr: far fewer lines than this.
_RELAYED_MAX_LINES = 100_000
_OPENING_CHARS = 80
# Lines of other output a traceback may be interrupted by and still resume.
_MAX_INTERRUPTION_LINES = 3
_MAX_OOM_LINES = 8


class LogParser(Failures, BarRuns, RecordNames, Milestones):
    """Feed it the trainer's output as it arrives; it returns the events each chunk completes.

    `coalesce_progress=True` is for reading a finished log (`diagnose`): a run of consecutive
    updates of the same bar becomes at most two Progress events (the highest step, and the
    last update with the last loss seen), emitted when the run ends, which makes a log of
    mostly bar updates several times faster to read. The diagnosis is the same; a live reader
    (`run`) keeps the default, one event per update as soon as it arrives.
    """

    def __init__(self, *, coalesce_progress: bool = False) -> None:
        self._buf = ""
        self._truncated = False
        self._pending_cr = False
        self._rich: _RichRecord | None = None
        self._oom: _PendingOom | None = None
        self._tb: _Traceback | None = None
        # The level of the record that held the traceback's header, when a logger wrote it: a
        # traceback logged one record per line goes on in records of that level.
        self._tb_level: str | None = None
        # A traceback interrupted by training output (stdout and stderr merged into one
        # log): it resumes if its frames or exception line follow within a few lines.
        self._suspended: _Traceback | None = None
        self._suspended_for = 0
        self._hints: deque[tuple[int, str]] = deque(maxlen=8)
        # An error record with no exception after it (Failure.tentative), held until a line shows the run going
        # on; at the log's end it is the failure. `_tentative_fresh`: the line being read set it.
        self._tentative: Failure | None = None
        # A bar was drawn in this run (a crash report's script name is then no launch).
        self._bar_drawn = False
        self._tentative_fresh = False
        self._oom_words_at: int | None = None
        self._n = 0
        # (line number, text) of the last indented bare line: a caret row under it makes it a frame's source.
        self._indented: tuple[int, str] | None = None
        self._exit_cut = False
        # (logical line number, status) of the last exit status read from a line.
        self._last_exit: tuple[int, int] | None = None
        self._state_dict_row: int | None = None
        self._chain: tuple[int, str] | None = None
        self._last_error: str | None = None
        self._last_error_ev = None
        self._processes = 1
        # The rank whose `[rankN]:` prefix the line being read carried (torchrun's per-rank output).
        self._line_rank: int | None = None
        self._entry_family: str | None = None
        self._family: str | None = None
        self._family_strength = 1 << 30
        self._wrapper: str | None = None
        self._name_lines = _NAME_LINES
        self._last_source: str | None = None
        self._last_logger: str | None = None
        # Inside Rich's traceback box drawn in ASCII (cleaning.ascii_box_row).
        self._ascii_box = False
        # Inside a titled box that is not a traceback (a progress panel).
        self._panel = False
        self._body_row = False
        # The last phase-word milestone was text-encoder caching (a text encoder loaded next is for it).
        self._caching_te = False
        self._last_func: str | None = None
        # (logical line number, update) of the last bar with no description (Failures._bar_before).
        self._loose_bar: tuple[int, Progress] | None = None
        self._nan_reported = False
        self._said_record = False
        self._zero_steps: set[int] = set()
        self._zero_reported = False
        # After a "training starts" milestone: 0 until a nameless bar is taken as the training
        # bar, then its total; None when no such milestone is pending.
        self._train_bar_total: int | None = None
        # The last named side bar (not the training bar) and its count, to read it once per run.
        self._side: tuple[str, int] | None = None
        # The phase the last milestone or training-bar update said, and the caching phase a bar
        # at its total ended (Milestones._side_bar).
        self._said_phase: str | None = None
        self._cache_ended: str | None = None
        # The end of caching a bar at its total said, held until something else is printed: a
        # caching bar that is the last thing in the text leaves the run caching.
        self._cache_done: Event | None = None
        self._cache_done_desc: str | None = None
        # After words announcing the pass right before training: True until a bar whose name no
        # phase word knows is taken as the training bar (its description then in _job_bar).
        self._before_training = False
        self._job_bar: str | None = None
        # The prefix a wrapper put before a relayed traceback's header (cleaning.relay_prefix).
        self._relay: str | None = None
        # Coalescing: the description of the last main bar, its run pattern, the lines of the
        # current run not yet summarised, and the summary (highest, last, last with a loss).
        self._coalesce = coalesce_progress
        self._bar_prefix: str | None = None
        self._bar_rx: re.Pattern | None = None
        self._run: list[str] = []
        self._run_open = False
        self._run_max: tuple[int, str] | None = None
        self._run_last: str | None = None
        self._run_loss_line: str | None = None
        # The log's opening lines (None once they cannot mark a copy), and the lines held back while
        # they may be starting again: (line, cleaned, record) as _physical got them.
        self._opening: list[str] | None = []
        self._opening_done = False
        self._held: list[tuple[str, bool, tuple[str, str | None] | None]] = []
        self._matched = 0
        self._replaying = False
        # accelerate's launcher (1.1x) re-raises a failed trainer as CalledProcessError "from
        # RuntimeError(<the tail of its stderr>)": after the trainer's exception line, "RuntimeError: "
        # and up to 512 KiB of lines already read, then "The above exception was the direct cause…".
        # Those lines are held here and dropped at that line (read as they came if it never follows).
        self._relayed_tail: list[tuple[str, bool, tuple[str, str | None] | None]] | None = None
        # The logical line number of the last exception line ("SomeError: …").
        self._exception_at = -1

    # ---- chunks to physical lines -----------------------------------------------------------

    def feed(self, chunk: str) -> list[Event]:
        out: list[Event] = []
        if not chunk:
            return out
        if self._pending_cr:
            # "\r\n" split across two chunks is still one line break.
            self._pending_cr = False
            if chunk[0] == "\n":
                chunk = chunk[1:]
                if not chunk:
                    return out
        if "\r" in chunk:
            self._pending_cr = chunk[-1] == "\r"
            chunk = chunk.replace("\r\n", "\n").replace("\r", "\n")
        if self._coalesce:
            self._feed_coalesced(chunk, out)
            return out
        parts = chunk.split("\n")
        if len(parts) == 1:
            self._append(parts[0])
            return out
        # A line already cut at MAX_LINE ignores the rest of its text.
        first = self._buf if self._truncated else self._buf + parts[0]
        self._buf = ""
        self._truncated = False
        self._physical(first[:MAX_LINE], out)
        for line in parts[1:-1]:
            self._physical(line[:MAX_LINE], out)
        self._append(parts[-1])
        return out

    def finish(self) -> list[Event]:
        """Flush the partial last line and whatever record, OOM message or traceback is open."""
        out: list[Event] = []
        if self._buf:
            line = self._buf
            self._buf = ""
            self._truncated = False
            if self._coalesce:
                self._coalesced([line], out)
            else:
                self._physical(line, out)
        self._pending_cr = False
        if self._relayed_tail is not None:
            self._release_relayed(out)
        if self._held:
            self._release(out)
        self._close(out, 0)
        return out

    def _close(self, out: list[Event], start: int) -> None:
        """End whatever is open, as the end of the log does (`out[start:]`: what the end has read)."""
        self._end_bar_run(out)
        self._flush_rich(out)
        self._flush_oom(out)
        self._end_suspended(out)
        if self._tb is not None:
            self._end_traceback(out)
        if self._tentative is not None and not any(isinstance(e, (Failure, Oom)) for e in out[start:]):
            out.append(self._tentative)
        self._tentative = None

    def _append(self, text: str) -> None:
        if self._truncated or not text:
            return
        self._buf += text
        if len(self._buf) > MAX_LINE:
            self._buf = self._buf[:MAX_LINE]
            self._truncated = True

    # ---- physical lines to logical lines --------------------------------------------------

    def _physical(self, line: str, out: list[Event], cleaned: bool = False,
                  record: tuple[str, str | None] | None = None) -> None:
        if self._relayed_tail is not None and not self._replaying:
            if not line.lstrip().startswith(CHAIN_WORDS):
                self._relayed_tail.append((line, cleaned, record))
                if len(self._relayed_tail) > _RELAYED_MAX_LINES:
                    self._release_relayed(out)
                return
            self._relayed_tail = None  # the launcher's own exception follows: the copy is dropped
        elif line[:14] == "RuntimeError: " and self._exception_at == self._n and self._tb is None \
                and not self._replaying:
            self._relayed_tail = [(line, cleaned, record)]
            return
        if self._opening_done and not self._replaying:
            if self._held or (line.startswith(self._opening[0]) and line.rstrip() == self._opening[0]):  # type: ignore[index]
                if self._hold(line, cleaned, record, out):
                    return
        elif self._opening is not None and not self._opening_done:
            self._note_opening(line)
        if line[:1] == ">" and (line[:2] == "> " or len(line) == 1 or line[1] in P.BOX_CHARS):
            # A log pasted as a markdown quote: every line behind "> ", which clean() stopped at;
            # a quoted blank line is a bare ">", and a quoted box row may lack the space.
            line = line[2:] if line[:2] == "> " else line[1:]
            while line[:2] == "> " or line == ">":
                # A quote inside a quote (a reply quoting a quoted log): "> > " before every line.
                line = line[2:]
            cleaned = False
        if not cleaned:
            self._line_rank = None
            if line[:1].isalnum() and (": " in line[:64] or " | " in line[:64]):
                # A launcher's host or worker name before every line ("node-1: [rank1]:…").
                end = P.host_prefix_end(line)
                if end:
                    line = line[end:]
            if line[:5] == "[rank":
                self._note_rank(line, out)
        if not cleaned and line and P.may_have_prefix(line):
            line, record = P.clean_record(line)
        if self._ascii_box or line[:1] in _RARE_STARTS:
            if line[:3] in _FENCES and FENCE_RE.fullmatch(line):
                # The fence of a markdown code block around a pasted log: no output of the run.
                return
            line, self._ascii_box = P.ascii_box_row(line, self._ascii_box)
        if self._relay is not None or line.find("Traceback (most", 0, 130) >= 0:
            line, self._relay = P.strip_relay(line, self._relay)
        if "%|" in line or "% " in line or "it [" in line or "━" in line or (  # what every bar form holds
                line[:1] in PR.HEADLESS_START and "|" in line) or (
                line[:1].isdigit() and "<" in line and "/" in line[:24]):
            m = PR.match_bar(line)
            if m is None and line.rstrip().endswith("0%|"):
                m = P.BAR_START_RE.match(line)
                if m and P.is_main_bar(m.group("desc")):
                    self._flush_rich(out)
                    self._flush_oom(out)
                    out.append(Progress(step=0, total=0, line=line.strip()))
                    return
                if m and self._cut_side_bar(m.group("desc"), out):
                    return
                m = None
            elif m is None and "%|" in line:
                cut = P.BAR_CUT_RE.match(line)
                if cut and int(cut.group("pct")) > 0 and P.is_main_bar(cut.group("desc")):
                    # The training bar redrawn (after a save or a sample): training went on.
                    self._flush_rich(out)
                    self._flush_oom(out)
                    out.append(Milestone(phase="training", name=BAR_REDRAWN, line=line.strip()[:200]))
                    return
                if cut and self._cut_side_bar(cut.group("desc"), out):
                    return
            if m:
                self._flush_rich(out)
                self._flush_oom(out)
                if self._tb is not None:
                    self._suspend_traceback(out)
                if self._cache_done is not None and not (m.desc == self._cache_done_desc and m.n == m.total):
                    self._end_caching(out)
                self._bar(m, line, out)
                self._bar_drawn = True
                # A bar drawn after an error record: the run went on.
                self._tentative = None
                rest = line[m.end:]
                if rest.strip():
                    self._physical(rest, out)
                return
        if self._cache_done is not None and line.strip():
            self._end_caching(out)
        if len(line) >= 80 and (line.count(":") >= 4 or "[rank" in line or 'File "' in line):
            lines = unflatten(line)
            if lines is not None:
                for piece in lines:
                    self._physical(piece, out)
                return
        if "| std" in line[:64]:
            r = P.REDIRECTED_RE.match(line)
            if r:
                # A logger re-logging the process's own output: read the line as written (a
                # traceback box row, a bar).
                self._physical(line[r.end():], out, cleaned=True)
                return
        rich = self._rich
        if rich is not None:
            if line.startswith(_RICH_INDENT):
                rich.add(line[P.RICH_MESSAGE_COLUMN:], P.cell_len(line))
                return
            self._flush_rich(out)
        if line.startswith("                    ") or (line[:1].isdigit() and line[4:5] == "-"):
            m = P.RICH_HEAD_RE.match(line)
            if m:
                if line[20:P.RICH_MESSAGE_COLUMN].rstrip() == m.group(1):
                    self._start_rich(m.group(1), line, out)
                else:
                    # Rich's columns with their padding collapsed to one space (a page or a
                    # copy that squeezes spaces): the message follows the level.
                    self._loose_rich(m.group(1), m.group(2) or "", out)
                return
        if line[:1] in (" ", "\t"):
            # The same with the blank time column squeezed or cut to some other width (" INFO
            # message src.py:12", a paste whose first line lost part of its indent): a level, a
            # message and Rich's source column, or the level in Rich's column, padded to its width
            # ("INFO     Building VAE" where the source column was cut).
            start = len(line) - len(line.lstrip())
            m = P.LOOSE_HEAD_RE.match(line, start) if line[start:start + 1] in _LEVEL_INITIALS else None
            if m and m.group(2) and (P.RICH_PATH_RE.search(m.group(2)) or m.start(2) - start == P.RICH_LEVEL_WIDTH):
                self._loose_rich(m.group(1), m.group(2), out)
                return
        if record is not None:
            if record[1]:
                self._logger(record[1], out, line)
            self._logical(line, record[0], out)
            return
        if line[:2] in ("[E", "[W", "[I", "[F"):
            m = P.C10_LOG_RE.match(line)
            if m:
                self._logical(line[m.end():], P.C10_LEVELS[m.group(1)], out)
                return
        elif line[:1] in ("D", "I", "W", "E", "C"):
            m = P.PYLOG_RE.match(line)
            if m:
                self._logger(m.group(2), out, m.group(3))
                if m.group(3).startswith(P.TRACEBACK_HEAD):
                    # A logger given the formatted traceback ("ERROR:finetrainers:Traceback (most recent
                    # call last):"): its frames follow as plain lines.
                    self._physical(m.group(3), out, cleaned=True)
                else:
                    self._logical(m.group(3), m.group(1), out)
                return
            m = P.LOOSE_HEAD_RE.match(line)
            if m:
                body = m.group(2) or ""
                g = P.GLOG_REST_RE.match(body)
                if g:
                    # vLLM logs every line of a traceback as an ERROR record: read what follows
                    # the record's head as a line of its own, indentation kept.
                    self._physical(body[g.end():], out, cleaned=True)
                    return
                # A Rich record behind another logger's head still names the file that logged.
                body = self._record_names(self._cut_source(body, out), out)
                if body[:1] == "|":
                    lm = P.LOGURU_AFTER_LEVEL_RE.match(body)
                    if lm:
                        body = lm.group(1)
                self._logical(body.rstrip(), m.group(1), out)
                return
        elif line[:2] == "| ":
            m = P.LOGURU_RE.match(line)
            if m:
                self._logical(m.group(2), P.LOGURU_LEVELS.get(m.group(1), m.group(1)), out)
                return
        elif line[:2] == "- ":
            # Python logging's "%(asctime)s - %(levelname)s - %(message)s", its time already cut.
            m = P.DASH_LEVEL_RE.match(line)
            if m:
                if m.group("logger"):
                    self._logger(m.group("logger"), out, m.group(3))
                self._logical(m.group(3), m.group(1), out)
                return
        self._logical(line, None, out)

    def _cut_source(self, body: str, out: list[Event]) -> str:
        """The record without Rich's source column (`train_util.py:779`), whose file is named."""
        pm = P.RICH_PATH_RE.search(body)
        if not pm:
            return body
        self._source_file(pm.group(1), out)
        return body[: pm.start()]

    def _loose_rich(self, level: str, body: str, out: list[Event]) -> None:
        self._logical(self._cut_source(body, out).rstrip(), level, out)

    def _start_rich(self, level: str, line: str, out: list[Event]) -> None:
        body = line[P.RICH_MESSAGE_COLUMN:]
        width = None
        line_width = P.cell_len(line)
        pm = P.RICH_PATH_RE.search(body)
        if pm:
            width = line_width - P.RICH_MESSAGE_COLUMN - len(pm.group(1)) - 1
            body = body[: pm.start()]
            self._source_file(pm.group(1), out)
        self._rich = _RichRecord(level, body, width if width and width > 0 else None, line_width)

    def _flush_rich(self, out: list[Event]) -> None:
        rich = self._rich
        if rich is None:
            return
        self._rich = None
        self._logical(rich.text(), rich.level, out)

    # ---- logical lines to events ------------------------------------------------------------

    def _logical(self, text: str, level: str | None, out: list[Event]) -> None:
        k = len(out)
        self._tentative_fresh = False
        self._logical_line(text, level, out)
        if self._tentative is None:
            return
        if self._oom is not None or any(isinstance(e, (Failure, Oom)) for e in out[k:]):
            # An exception or an OOM (maybe the record's own words, naming a kind) is the failure.
            self._tentative = None
            return
        s = text.strip()
        if self._tentative_fresh or not s or text[:1].isspace() or s[:1] in "-*•":
            # Another error record, a blank line, or the error's own detail rows ("* VAELoader 75:", "  - Value
            # not in list").
            return
        if not any(isinstance(e, Exited) for e in out[k:]):
            self._tentative = None

    def _logical_line(self, text: str, level: str | None, out: list[Event]) -> None:
        self._n += 1
        s = text.strip()
        if self._oom is not None:
            if level is None and s and self._oom_continues(s):
                self._oom.parts.append(s)
                if len(self._oom.parts) >= _MAX_OOM_LINES or self._oom.done():
                    self._flush_oom(out)
                return
            self._flush_oom(out)
        if not s:
            return
        low = s.lower()
        if "proc" in low:
            m = P.PROCESSES_RE.search(s)
            if m and int(m.group(1)) > max(1, self._processes):
                self._processes = int(m.group(1))
                out.append(Processes(count=self._processes, line=s[:200]))
        if self._exit_cut:
            # "… returned non-zero exit" folded by the console before "status 3221225477.".
            self._exit_cut = False
            m = P.EXIT_TAIL_RE.match(s)
            if m:
                out.append(Exited(status=int(m.group(1)), line=s))
                return
        if low.endswith(("non-zero exit", "non-zero exit status")):
            self._exit_cut = True
        if self._name_lines > 0 or self._tb is not None or self._suspended is not None or (
                level is not None and level not in ("INFO", "DEBUG")):
            self._name_lines -= 1
            self._names(s, low, out)
        if self._suspended is not None:
            if level is None and (text[:1].isspace() or P.EXC_LINE_RE.match(s)):
                self._tb, self._suspended = self._suspended, None
            else:
                self._suspended_for += 1
                if self._suspended_for > _MAX_INTERRUPTION_LINES:
                    self._end_suspended(out)
        tb = self._tb
        if tb is not None and self._in_traceback(tb, text, s, level, out):
            return
        if P.traceback_head(s) or (s[0] == "T" and len(s) >= 12 and P.TRACEBACK_HEAD.startswith(s)):
            # (The last: a header the paste's end cut, "Traceback (most rece".)
            self._start_traceback(s)
            self._tb_level = level
            return
        if s[0] in "DT" and s.startswith(CHAIN_WORDS) and self._last_error is not None:
            self._chain = (self._n, self._last_error)
            return
        if s[0] in "╭┏" and any(ch.isalpha() for ch in s):
            # A titled box that is not a traceback (a trainer's progress panel): its rows are
            # read as lines of their own.
            self._panel = True
            return
        if self._panel:
            if s[0] in "│┃":
                row = s.strip("│┃ ")
                if row:
                    self._milestone(row, out)
                return
            self._panel = False
            if s[0] in P.BOX_CLOSE:
                return
        if s[0] in P.BOX_CHARS:
            # The top of a Rich traceback box may have scrolled away; its frames still count.
            self._tb = _Traceback(explicit=False, boxed=True)
            self._tb.bar = self._bar_before()
            self._tb_level = None
            self._tb.add(s.strip("│┃ "))
            return
        if level is None:
            indented = self._indented
            opening = headless_opening(s, indented[1] if indented and indented[0] == self._n - 1 else None)
            if opening:
                # A paste that starts inside a traceback: its frames still say where it failed.
                self._tb, self._tb_level = _Traceback.headless_at(opening), None
                self._tb.bar = self._bar_before()
                return
            if text[:1].isspace():
                self._indented = (self._n, s)
        if level is None and not text[:1].isspace():
            m = P.EXC_LINE_RE.match(s)
            if m:
                self._exception(m.group(1) or m.group(3), s, None, out)
                return
        if level is not None or low.lstrip(" *#!=>-[")[:1] in ("e", "f"):
            self._error_notice(s, low, level)
        if ("fail" in low or "during" in low or "while" in low or " in " in low) and self._report(s, low, level, out):
            return
        # An indented line with no level of its own is a row of a record's body (sd-scripts'
        # dataset summary in the simple format), which the record's head already placed.
        self._body_row = level is None and text[:1] in (" ", "\t")
        if level is None and crash_line(s) is not None:
            # The shell's report names the script whose command crashed ("./train.sh: line 9: 713 Killed
            # …"): before any bar that script was still starting the job (its milestone); the crash is
            # the failure.
            if not self._bar_drawn and self._milestone(s, out):
                self._note_said(out)
            self._failure_line(s, level, out, low)
            return
        if self._milestone(s, out):
            self._note_said(out)
            return
        if level in ("INFO", "DEBUG", "WARNING"):
            # sd-scripts' own log messages: they report progress, never the crash itself; only
            # a warning may explain a later crash.
            if not self._said_record:
                self._said_record = True
                out.append(Milestone(phase="model_load", name=JOB_RECORD, line=s[:200]))
            if level == "WARNING":
                self._hint(s, low)
            return
        self._failure_line(s, level, out, low)

    # ---- a second copy of the output ------------------------------------------------------------

    def _note_opening(self, line: str) -> None:
        s = line.rstrip()
        if not s:
            return
        opening = self._opening
        assert opening is not None
        if not opening and s.lstrip().startswith(("Traceback (most", "File \"", "[rank")):
            self._opening = None
            return
        opening.append(s)
        if len(opening) == _OPENING_LINES:
            if sum(map(len, opening)) < _OPENING_CHARS or len(set(opening)) < _OPENING_LINES:
                self._opening = None
            else:
                self._opening_done = True

    def _hold(self, line: str, cleaned: bool, record: tuple[str, str | None] | None, out: list[Event]) -> bool:
        """Hold `line` back while the lines since the log's first one repeat its opening; True when
        it was held (or, completing the opening, began a second copy). A line that breaks the
        repeat lets the held ones through, read as they would have been, and is read after them."""
        s = line.rstrip()
        opening = self._opening
        assert opening is not None
        if not s or s == opening[self._matched]:
            self._held.append((line, cleaned, record))
            if s:
                self._matched += 1
            if self._matched == _OPENING_LINES:
                self._second_copy(out)
            return True
        self._release(out)
        if s == opening[0]:
            self._held.append((line, cleaned, record))
            self._matched = 1
            return True
        return False

    def _release_relayed(self, out: list[Event]) -> None:
        held, self._relayed_tail = self._relayed_tail or [], None
        self._read_held(held, out)

    def _release(self, out: list[Event]) -> None:
        held, self._held, self._matched = self._held, [], 0
        self._read_held(held, out)

    def _read_held(self, held: list[tuple[str, bool, tuple[str, str | None] | None]], out: list[Event]) -> None:
        """Lines held back, read as they came (and never held again)."""
        self._replaying = True
        try:
            for line, cleaned, record in held:
                self._physical(line, out, cleaned, record)
        finally:
            self._replaying = False

    def _second_copy(self, out: list[Event]) -> None:
        """The output again from its start: what is open ends as the log's end would end it, and
        the copy is read by a parser as fresh as the first copy's was."""
        held = self._held
        self._held, self._matched = [], 0
        self._close(out, len(out))
        out.append(Restart(line=held[-1][0].strip()[:200]))
        # What reading a chunk holds, and the coalescing run list _coalesced appends to.
        keep = {k: getattr(self, k) for k in ("_buf", "_truncated", "_pending_cr", "_run", "_opening")}
        self.__init__(coalesce_progress=self._coalesce)  # type: ignore[misc]
        for k, v in keep.items():
            setattr(self, k, v)
        self._opening_done = True
        self._read_held(held, out)

    # ---- state ---------------------------------------------------------------------------------

    def _new_run(self) -> None:
        self._name_lines = _NAME_LINES
        self._entry_family = None
        self._nan_reported = False
        self._said_record = False
        self._zero_steps.clear()
        self._zero_reported = False
        self._before_training = False
        self._job_bar = None
        self._bar_drawn = False


def parse_text(text: str) -> list[Event]:
    """Every event in a whole log text, read as the reader reads a file (inputform: a capture tool's
    prefix or a paste's indent on every line taken off first)."""
    form = sniff_form(text[:1 << 16], len(text) <= 1 << 16)
    if form is not None:
        text = FormFilter(form).feed(text, final=True)
    parser = LogParser()
    events = parser.feed(text)
    events.extend(parser.finish())
    return events
