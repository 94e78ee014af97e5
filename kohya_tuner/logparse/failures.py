"""Tracebacks, exception lines, OOM messages and other failure lines: the failure half of the
parser. A mixin of LogParser (its state is set up in LogParser.__init__): `_in_traceback` takes
a line while a traceback is open, `_exception` an exception line, `_end_traceback` a traceback
cut before its error line, `_failure_line` a bare line that may name a failure.
"""

from __future__ import annotations

import re
from collections import deque

from kohya_tuner.logparse import frames as F
from kohya_tuner.logparse import patterns as P
from kohya_tuner.logparse import phase_words as PW
from kohya_tuner.logparse.events import Event, Exited, Failure, Oom, Progress
from kohya_tuner.logparse.oomfigures import oom_figures
from kohya_tuner.logparse.records import BOX_FRAME_RE, _PendingOom, _Traceback, last_frame

# A Python traceback this long without its error line is not one (or its end was lost).
_MAX_TRACEBACK_LINES = 2000
# Rows of an untitled box read back as lines once it proves to be no traceback (a panel is short).
_PANEL_ROWS = 40
# Logical lines a traceback's header may come after a bar with no description and still be read
# with it: the bar's line with another message run onto its end, then the header.
_BAR_BEFORE_LINES = 2
# Logical lines between a chaining line ("During handling of the above exception…") and the header of
# the traceback it introduces (a blank line, the header doubled by two streams).
_CHAIN_LINES = 3
CHAIN_WORDS = ("During handling of the above exception", "The above exception was the direct cause")
# Logical lines after a hint (a warning naming a cause) within which a failure may be its.
HINT_WINDOW = 60


# The interpreter's "can't open file '…\\wan_cache_latents.py': [Errno 2]" (lower-cased): the script's name.
# A shell's report of a child it ran that a signal ended ("/bin/bash: line 1:   713 Killed   python3 train.py",
# "./lib.include.sh: line 130: 50376 Segmentation fault      (core dumped) "$@"", a bare "Segmentation fault
# (core dumped)") and Python's own fatal-signal line ("Fatal Python error: Segmentation fault"): the job crashed
# where it printed nothing more. Group `sig` is the signal's words.
CRASH_RE = re.compile(
    r"^\S+: line \d+: +\d+ +(?P<sig>Killed|Segmentation fault|Aborted|Bus error|Illegal instruction"
    r"|Floating point exception)(?: +\(core dumped\))?(?: .*)?$"
    r"|^(?P<bare>Segmentation fault|Aborted|Bus error|Illegal instruction|Floating point exception)"
    r"(?: \(core dumped\))?\s*$"
    r"|^Fatal Python error: (?P<fatal>Segmentation fault|Aborted|Bus error|Illegal instruction"
    r"|Floating point exception)\b")

# How a crash's failure message starts (its advice is keyed on it).
CRASH_PREFIX = "the process crashed ("


def crash_line(s: str) -> re.Match | None:
    """A shell's or Python's report of a crash (CRASH_RE), tested only where one can be: a line with
    "line N:" in it or one that starts as a signal's words do."""
    if ": line " in s[:260] or s[:1] in "SABIF":
        return CRASH_RE.match(s)
    return None


_CANT_OPEN_RE = re.compile(r"can't open file ['\"](?:[^'\"]*[\\/])?([\w\-]+)\.py['\"]: \[errno 2\]")


def _worded_failure(kind: str, s: str) -> Failure:
    """A failure line with no frames, placed by what its own words say failed (`[[message]]`)."""
    ev = F.message_evidence(s)
    return Failure(kind=kind, message=s[:500], where=ev.diagnose_phase if ev else None,
                   frame=ev.what if ev else None, frame_level=ev.level if ev else None, line=s)


class Failures:
    _tb: _Traceback | None
    _tb_level: str | None
    _suspended: _Traceback | None
    _suspended_for: int
    _oom: _PendingOom | None
    _hints: deque[tuple[int, str]]
    _oom_words_at: int | None
    _tentative: Failure | None
    _tentative_fresh: bool
    _n: int
    _line_rank: int | None
    _loose_bar: tuple[int, Progress] | None
    _last_exit: tuple[int, int] | None
    # The logical line of the last row of a state-dict report whose head was cut.
    _state_dict_row: int | None
    # (logical line, the error line before it) of the last "During handling of the above exception"
    # or "The above exception was the direct cause" line.
    _chain: tuple[int, str] | None
    _last_error: str | None
    _exception_at: int
    # What the last error's frames said: a cut traceback raised while handling it, its own frames
    # saying nothing, failed where it did (an import's fallback raising again, 359).
    _last_error_ev: F.FrameEvidence | None

    def _bar_before(self) -> Progress | None:
        """The update of a bar with no description (or with its description cut by a paste)
        printed right before a traceback opens. A failure whose frames are in the trainer's own
        training step makes it the training bar: the bar on screen when that step failed."""
        loose, self._loose_bar = self._loose_bar, None
        if loose is None or self._n - loose[0] > _BAR_BEFORE_LINES:
            return None
        return loose[1]

    @staticmethod
    def _step_bar(bar: Progress | None, ev: F.FrameEvidence | None, out: list[Event]) -> None:
        if bar is not None and ev is not None and ev.phase == F.STEP and ev.level == 1:
            out.append(bar)

    def _in_traceback(self, tb: _Traceback, text: str, s: str, level: str | None, out: list[Event]) -> bool:
        """Take a line that arrives while a traceback is open; False when the traceback ended
        and the line is to be read as usual."""
        if level is not None and level != self._tb_level:
            self._end_traceback(out)
            return False
        if P.traceback_head(s):
            if tb.frames:
                self._end_traceback(out)
            # else: the same header twice (two streams printing one traceback): one traceback.
            self._start_traceback(s)
            return True
        if s[0] in P.BOX_CHARS:
            if len(s) == 1 and tb.boxed:
                # A row's right edge alone on a line: a console narrower than the box wrapped its rows.
                tb.wrapped = True
            tb.add(s.strip("│┃ "))
            return True
        if not text[:1].isspace():
            m = P.EXC_LINE_RE.match(s)
            if m:
                self._tb = None
                self._exception(m.group(1) or m.group(3), s, tb.frames, out, tb.bar)
                return True
            if tb.boxed and not tb.wrapped:
                # After a Rich box only its exception line belongs to it (in a wrapped box, a row's
                # text that wrapped to the start of a line is still the box's).
                self._end_traceback(out)
                return False
            found: list[Event] = []
            if self._milestone(s, found):
                # Training output in the middle of a traceback: another pipe's line, or the
                # traceback was cut short. Hold it open for a few lines to tell which.
                self._suspend_traceback(out)
                out.extend(found)
                return True
        tb.add(s)
        if tb.lines > _MAX_TRACEBACK_LINES:
            self._end_traceback(out)
        return True

    def _failure_line(self, s: str, level: str | None, out: list[Event], low: str) -> None:
        """A line that is not an exception line but may still name a failure."""
        if "closing signal" in low and low.startswith("sending process", low.find("] ") + 2 if "] " in low else 0):
            # torchrun's agent stopping the other ranks ("Sending process N closing signal
            # SIGTERM"): a worker failed, and the run with it.
            out.append(Exited(status=None, line=s))
            return
        crash = crash_line(s)
        if s == "Killed" or s.endswith(" Killed") or (crash is not None and crash["sig"] == "Killed"):
            out.append(Failure(kind="cpu_oom", message="the process was killed (Killed), most likely by the "
                                                        "system's out-of-memory killer", line=s))
            return
        if crash is not None:
            sig = (crash["sig"] or crash["bare"] or crash["fatal"]).lower()
            out.append(Failure(kind="other", message=f"{CRASH_PREFIX}{sig}) and printed no Python error", line=s))
            return
        if "can't open file" in low:
            ev = F.start_up_line_evidence(s)
            m = _CANT_OPEN_RE.search(low) if ev is None else None
            found = PW.source_phase(m.group(1)) if m else None
            if ev is None and found is not None and found[0] in ("cache_latents", "cache_text_encoder"):
                # A caching script the host runs as a pass of its own is not there: that pass failed.
                ev = F.FrameEvidence(found[0], "a caching script could not be opened", 2, s.strip()[:300])
            if ev is not None:
                out.append(Failure(kind="other", message=s[:500], where=ev.diagnose_phase, frame=ev.what,
                                   frame_level=ev.level, line=s))
                return
        if ("state_dict" in low or "while copying" in low or "size mismatch" in low) \
                and P.STATE_DICT_REPORT_RE.match(low):
            # torch's report of the keys a state dict lacks or has too many (or of a parameter it could
            # not copy, or whose shape differs), its head line ("Error(s) in loading state_dict for …")
            # cut: the failure itself. Its rows (one per mismatched parameter) are one failure.
            if self._state_dict_row != self._n - 1:
                out.append(_worded_failure(P.error_kind(s), s))
            self._state_dict_row = self._n
            return
        if not P.SUSPECT_RE.search(low):
            return
        status = P.exit_status(s)
        if status is not None:
            if self._last_exit != (self._n - 1, status):
                # torch elastic's error record gives a worker's status twice, as its `exitcode`
                # and its `traceback : Signal 9 (SIGKILL) …` on the next line: one exit.
                out.append(Exited(status=status, line=s))
            self._last_exit = (self._n, status)
            return
        if P.plain_line_is_oom(s):
            self._start_oom(s, None, out)
            return
        if P.CPU_OOM_RE.search(low):
            out.append(Failure(kind="cpu_oom", message=s[:500], line=s))
            return
        kind = P.error_kind(s)
        if P.JOB_FAILED_RE.match(low):
            # A job runner's record of the job's failure (ai-toolkit's "Error running job: …",
            # ComfyUI's "!!! Exception during processing !!!"): the error; the traceback printed after
            # it, if any, is its own. Its words may name the call that failed.
            out.append(_worded_failure(kind, s))
            return
        if kind == "distributed" and "allreduce" in low and P.NCCL_ALLREDUCE_TIMEOUT_RE.search(low):
            out.append(Failure(kind=kind, message=s[:500], where="training", line=s,
                               frame="a gradient all-reduce timed out (NCCL's watchdog)", frame_level=2))
            return
        if "module specification" in low and P.FATAL_OTHER_RE.search(low):
            # The interpreter's own report that it could not run what it was asked to ("Error while finding
            # module specification for 'accelerate.commands.launch' (ModuleNotFoundError: …)").
            out.append(_worded_failure(kind, s))
            return
        if "not " in low and P.LAUNCHER_NOT_FOUND_RE.match(low.strip()):
            out.append(_worded_failure("other", s))
            return
        if kind == "bad_argument" and ".py: error:" in s:
            out.append(Failure(kind=kind, message=s[:500], line=s))
            return
        if kind != "other" and (level in ("ERROR", "CRITICAL") or low.startswith(("error", "fatal"))
                                or low.startswith(P.FATAL_WITHOUT_LEVEL)
                                or low.lstrip().startswith(("cuda error:", "hip error:"))):
            # A "CUDA error: <text>" message with its exception's name cut off is the error itself.
            # Its words may say what failed (the dataset's own check: "No data found").
            out.append(_worded_failure(kind, s))
            return
        self._hint(s, low)

    def _error_notice(self, s: str, low: str, level: str | None) -> None:
        """An error record or a program's own error notice: the failure if the log ends with it (the parser
        holds it until a line shows the run going on). The first of several is the cause."""
        if level not in ("ERROR", "CRITICAL") and (level is not None or not P.ERROR_NOTICE_RE.match(low)):
            return
        self._tentative_fresh = True
        if self._tentative is None:
            f = _worded_failure(P.error_kind(s), s)
            self._tentative = Failure(kind=f.kind, message=f.message, where=f.where, frame=f.frame,
                                      frame_level=f.frame_level, line=s, tentative=True)

    def _hint(self, s: str, low: str | None = None) -> None:
        if low is None:
            low = s.lower()
        if not P.SUSPECT_RE.search(low):
            return
        if "memory" in low and P.GPU_OOM_RE.search(low):
            # Wording that says out of memory without being the error itself: a cut traceback
            # after it is likely an OOM.
            self._oom_words_at = self._n
        kind = P.hint_kind(s)
        if kind is not None:
            self._hints.append((self._n, kind))

    def _context_kind(self, frames: list[str] | None) -> str:
        """For an error with no telling message: what its frames or the lines before it say."""
        if frames:
            for line in frames:
                kind = P.error_kind(line)
                if kind in ("xformers", "bitsandbytes", "distributed", "cuda_unavailable"):
                    return kind
        for n, kind in reversed(self._hints):
            if self._n - n <= HINT_WINDOW:
                return kind
        return "other"

    # ---- tracebacks, exceptions, OOM messages ---------------------------------------------

    def _start_traceback(self, s: str) -> None:
        self._tb = _Traceback(explicit=True, boxed=s[0] in "╭┏")
        self._tb.bar = self._bar_before()
        chain = self._chain
        if chain is not None and self._n - chain[0] <= _CHAIN_LINES:
            self._tb.chained = chain[1]
        self._chain = None
        rest = s.split(P.TRACEBACK_HEAD, 1)[-1].strip(" ):─╮┓")
        if rest:
            self._tb.add(rest)

    def _end_suspended(self, out: list[Event]) -> None:
        if self._suspended is not None:
            self._tb, self._suspended = self._suspended, None
            self._end_traceback(out)

    def _suspend_traceback(self, out: list[Event]) -> None:
        """Training output broke into a traceback: hold it open for a few lines (its error line
        may still follow, from the other stream), then report it cut."""
        self._end_suspended(out)
        self._suspended, self._suspended_for, self._tb = self._tb, 0, None

    def _end_traceback(self, out: list[Event]) -> None:
        """A traceback that stopped without its exception line: the log was cut (how users
        usually paste) or other output broke in. Its frames still say where it failed."""
        tb = self._tb
        self._tb = None
        if tb is None:
            return
        if not tb.explicit and not tb.headless and not (tb.boxed and any(BOX_FRAME_RE.search(f) for f in tb.frames)):
            if tb.boxed:
                # A box with no frame in it was no traceback but a panel whose top edge has no title (a
                # trainer's progress panel): its rows are read as lines of their own.
                for row in tb.frames[:_PANEL_ROWS]:
                    if row:
                        self._milestone(row, out)
            return
        ev = F.frame_evidence(tb.frames)
        if P.launcher_only(tb.frames) and not (ev is not None and ev.phase == "model_load"):
            # The launcher reporting the trainer's exit; cut inside its own checks of its arguments
            # or config it is the launcher failing as it starts the job (a start-up failure).
            out.append(Exited(status=None, line="Traceback (launcher)"))
            return
        last = last_frame(tb)
        if ev is None and tb.chained is not None and tb.chained == self._last_error:
            ev = self._last_error_ev
        if ev is None:
            # Cut while a training script's imports were still running (only top-level frames).
            ev = F.start_up_evidence(tb.frames, "", cut=True)
        if ev is None and tb.boxed:
            ev = F.job_code_evidence(tb.frames)
        self._step_bar(tb.bar, ev, out)
        suspected = None
        if any(P.GPU_OOM_RE.search(f.lower()) for f in tb.frames) or (
                self._oom_words_at is not None and self._n - self._oom_words_at <= HINT_WINDOW):
            suspected = "oom"
        else:
            kind = self._context_kind(tb.frames)
            suspected = None if kind == "other" else kind
        during = f" raised while handling `{tb.chained[:200]}`" if tb.chained else ""
        out.append(Failure(kind="truncated",
                           message=f"the log ends inside a traceback{during}: its error line is missing"
                                   + (f" (last frame: {last[:200]})" if last else ""),
                           where=ev.diagnose_phase if ev else None, frame=ev.what if ev else None,
                           frame_level=ev.level if ev else None, suspected=suspected, line=P.TRACEBACK_HEAD,
                           chained=tb.chained is not None))

    def _exception(self, exc_type: str, s: str, frames: list[str] | None, out: list[Event],
                   bar: Progress | None = None) -> None:
        self._exception_at = self._n
        ev = F.frame_evidence(frames) if frames else None
        self._step_bar(bar, ev, out)
        if ev is None:
            ev = (F.start_up_evidence(frames, s) if frames else None) or F.message_evidence(s, framed=bool(frames))
        where = ev.diagnose_phase if ev else None
        if exc_type in P.LAUNCHER_WRAPPERS:
            out.append(Exited(status=P.exit_status(s), line=s))
            return
        if exc_type == "KeyboardInterrupt":
            out.append(Failure(kind="other", message="KeyboardInterrupt: the run was interrupted", where=where,
                               line=s))
            return
        if P.is_oom(s):
            self._start_oom(s, ev, out)
            return
        kind = P.error_kind(s, exc_type)
        if kind == "other" and P.exit_status(s) is not None:  # a wrapper raising the trainer's exit status
            out.append(Exited(status=P.exit_status(s), line=s))
            return
        if kind == "other":
            kind = self._context_kind(frames)
        self._last_error, self._last_error_ev = s, ev
        out.append(Failure(kind=kind, message=s[:500], where=where, frame=ev.what if ev else None,
                           frame_level=ev.level if ev else None, line=s))

    def _oom_continues(self, s: str) -> bool:
        if s[0] in P.BOX_CHARS or s.startswith((P.TRACEBACK_HEAD, "During handling", "The above exception",
                                                  'File "', "Traceback")):
            return False
        return not P.EXC_LINE_RE.match(s) or bool(P.OOM_STAT_LINE_RE.match(s))

    def _start_oom(self, s: str, ev, out: list[Event]) -> None:
        # An OOM message may go on over the next lines (its figures, the allocator's advice): it is
        # held until it ends, unless this line already holds all of it.
        self._oom = _PendingOom(s, ev, self._line_rank)
        if self._oom.done():
            self._flush_oom(out)

    def _flush_oom(self, out: list[Event]) -> None:
        pending = self._oom
        if pending is None:
            return
        self._oom = None
        ev = pending.evidence
        out.append(Oom(figures=oom_figures(pending.text()), where=ev.diagnose_phase if ev else None,
                       frame=ev.what if ev else None, frame_level=ev.level if ev else None, line=pending.first,
                       rank=pending.rank))
