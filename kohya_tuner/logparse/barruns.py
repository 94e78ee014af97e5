"""Progress bars: one update read (`_bar`: the training bar's step, total and loss; a bar
with no description right after training starts; the NaN and zero-loss checks), and, for
reading a finished log fast, runs of bar updates folded instead of read one by one.

Most of a long log's bytes are tqdm refreshing one bar. For `diagnose` only the highest step,
the last update and the last loss of each run of consecutive updates matter, so a run is
collected with two string tests per line and summarised with a few counts and two regex
matches over the whole run; only a line whose loss is NaN, infinite or 0 (which may be a
failure), a coloured line, or a line that turns out not to be a plain update is read the
usual way. `LogParser(coalesce_progress=True)` mixes this in; `run` keeps one event per update.
"""

from __future__ import annotations

import math
import re

from kohya_tuner.logparse import patterns as P
from kohya_tuner.logparse import progress as PR
from kohya_tuner.logparse.events import EpochStart, Event, Failure, Progress
from kohya_tuner.logparse.records import MAX_LINE

# Bar updates a coalescing parser must look at one by one: a loss that is NaN, infinite or 0.
_ZERO_LOSS_RE = re.compile(r"loss=-?0(?:\.0*)?(?:[,\]]|e)")
# This many distinct optimizer steps at a loss of exactly 0 means the model is not learning.
_ZERO_LOSS_STEPS = 10
# A bar description no line starts with (no bar seen yet).
_NEVER = "\x00\x00"
# First characters that make clean() look for another prefix.
_CLEANED_ON = frozenset("[0123456789")
# FluxGym's prefix of every line, one of the forms clean() strips.
_TOOL_PREFIX_RE = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] (?:\[INFO\] )?")


def _special_positions(text: str) -> list[int]:
    """Where "nan", "inf" or a zero loss occur, in order (str.find and a literal-led regex
    are far faster over a long text than one alternation)."""
    found = [m.start() for m in _ZERO_LOSS_RE.finditer(text)]
    for word in ("nan", "inf"):
        i = text.find(word)
        while i >= 0:
            found.append(i)
            i = text.find(word, i + 3)
    found.sort()
    return found

def _bar_run_re(prefix: str) -> re.Pattern:
    """Every line of text that is exactly one update of the bar with this description, with
    its step and total."""
    return re.compile(r"(?m)^" + re.escape(prefix) + r"\s*\d{1,3}%\|[^|\n]*\|\s*(\d+)/(\d+)\s*\[[^\]\n]*\]$")


class BarRuns:
    """The bar half of LogParser: one bar update read, and runs of them folded (its state is
    set up in LogParser.__init__)."""

    def _nameless_training_bar(self, desc: str, bar: PR.Bar) -> bool:
        """A bar without a description right after the trainer said training starts ("Starting
        to train…", "***** Running training *****") is the training bar (the transformers
        Trainer's, and scripts built on it); later nameless bars count only with its total."""
        if desc.strip() or self._train_bar_total is None:
            return False
        if self._train_bar_total == 0:
            self._train_bar_total = bar.total
        return bar.total == self._train_bar_total

    def _bar(self, bar: PR.Bar, line: str, out: list[Event]) -> None:
        desc = bar.desc
        self._loose_bar = None
        if P.is_main_bar(desc):
            self._train_bar_total = None
        elif (desc and P.sampling_bar(desc)) or (
                not P.trainer_postfix(bar.inner) and not P.trainer_description(desc)
                and not self._nameless_training_bar(desc, bar)
                and not self._job_named_bar(desc)):
            if bar.n is not None and bar.total and not desc.strip(" :"):
                # A bar with no description (or one a paste cut off) may be the training bar:
                # the failure right after it says whether it was (Failures._bar_before).
                self._loose_bar = (self._n, Progress(step=bar.n, total=bar.total, rate=bar.rate,
                                                     line=line[: bar.end].strip()))
            if bar.n is not None or bar.pct == 0:
                self._side_bar(desc, bar.n or 0, out, bar.total)
            elif desc.strip(" :"):
                # Cut before its counts, the bar still says by its name what the trainer was doing.
                self._named_side_bar(desc, 0, out)
            return
        self._before_training = False
        self._said_phase = "training"
        self._cache_ended = None
        if desc != self._bar_prefix and desc:
            self._bar_prefix = desc
            self._bar_rx = _bar_run_re(desc)
            epoch = P.numbered_epoch(desc)
            if epoch:
                # A bar for a later epoch (0-based in its name): whole epochs of steps are done.
                out.append(EpochStart(epoch=epoch + 1, line=line[: bar.end].strip()))
        text = line[: bar.end].strip()
        if bar.n is None:
            # A percentage alone (Rich's default columns) counts no step, except at 0 %.
            if bar.pct == 0:
                out.append(Progress(step=0, total=bar.total, line=text))
            return
        step = bar.n
        loss = PR.bar_loss(bar.inner)
        out.append(Progress(step=step, total=bar.total, loss=loss, rate=bar.rate, line=text))
        if loss is None:
            return
        if math.isnan(loss) or math.isinf(loss):
            if not self._nan_reported:
                self._nan_reported = True
                out.append(Failure(kind="nan_loss", message=f"the training loss is {loss} at step {step}",
                                   where="training", line=text))
            return
        if loss == 0.0:
            self._zero_steps.add(step)
            if len(self._zero_steps) >= _ZERO_LOSS_STEPS and not self._zero_reported:
                self._zero_reported = True
                out.append(Failure(kind="nan_loss",
                                   message=f"the training loss has been exactly 0 for {len(self._zero_steps)} steps",
                                   where="training", line=text))
        else:
            self._zero_steps.clear()

    def _feed_coalesced(self, chunk: str, out: list[Event]) -> None:
        nl = chunk.find("\n")
        if nl < 0:
            self._append(chunk)
            return
        first = self._buf if self._truncated else self._buf + chunk[:nl]
        self._buf = ""
        self._truncated = False
        self._coalesced([first], out)
        parts = chunk[nl + 1:].split("\n")
        self._coalesced(parts[:-1], out)
        self._append(parts[-1])

    def _coalesced(self, lines: list[str], out: list[Event]) -> None:
        prefix = self._bar_prefix or _NEVER
        # A description that clean() would go on stripping cannot follow a tool's prefix here.
        after_tool = prefix[:1] not in _CLEANED_ON
        tool = _TOOL_PREFIX_RE.match
        run = self._run
        append = run.append
        for line in lines:
            # The cheap tests first: most lines of a long log are updates of the one bar, bare
            # or behind FluxGym's "[time] [INFO] ".
            if line[-1:] == "]" and len(line) < 1024:
                if line.startswith(prefix):
                    self._run_open = True
                    append(line)
                    continue
                if after_tool and line[:1] == "[":
                    m = tool(line)
                    if m:
                        end = m.end()
                        if line.startswith(prefix, end) and "\x1b" not in line and "[0m" not in line:
                            self._run_open = True
                            append(line[end:])  # what clean() leaves of it
                            continue
            if len(line) > MAX_LINE:
                line = line[:MAX_LINE]
            self._line_rank = None
            if line[:1].isalnum() and (": " in line[:64] or " | " in line[:64]):
                end = P.host_prefix_end(line)
                if end:
                    line = line[end:]
            record = None
            if line and P.may_have_prefix(line):
                if line[:5] == "[rank":
                    self._note_rank(line, out)
                line, record = P.clean_record(line)
                if line[-1:] == "]" and line.startswith(prefix) and len(line) < 1024:
                    self._run_open = True
                    append(line)
                    continue
            if self._run_open:
                self._end_bar_run(out)
            self._physical(line, out, cleaned=True, record=record)
            prefix = self._bar_prefix or _NEVER
            after_tool = prefix[:1] not in _CLEANED_ON
        if run:
            self._summarise_run(out)

    def _bars_begin(self, out: list[Event]) -> None:
        # What a bar line ends, as in _physical.
        self._loose_bar = None
        self._flush_rich(out)
        self._flush_oom(out)
        if self._tb is not None:
            self._suspend_traceback(out)

    def _summarise_run(self, out: list[Event]) -> None:
        """Fold the pending candidate lines of the current run into its summary."""
        run = self._run[:]
        self._run.clear()
        if self._cache_done is not None:
            # The training bar's updates came after a caching bar at its total: the caching ended first.
            self._end_caching(out)
        self._fold_text("\n".join(run), out)

    def _fold_text(self, text: str, out: list[Event]) -> None:
        """Lines of bar updates (joined by \\n) into the run's summary. A loss of NaN, infinity
        or 0 is read in its own line (it may be a failure); the stretches around it are folded."""
        if "\x1b" in text or "[0m" in text:
            self._one_by_one(text.split("\n"), out)
            return
        if "nan" not in text and "inf" not in text and not _ZERO_LOSS_RE.search(text):
            self._fold(text, out)
            return
        pos = 0
        for at in _special_positions(text):
            start = text.rfind("\n", 0, at) + 1
            if start < pos:
                continue  # a second match in a line already read
            end = text.find("\n", at)
            end = len(text) if end < 0 else end
            if start > pos:
                self._fold(text[pos:start - 1], out)
            self._emit_run(out)
            self._physical(text[start:end], out, cleaned=True)
            pos = end + 1
        if pos == 0:
            self._fold(text, out)
        elif pos < len(text):
            self._fold(text[pos:], out)

    def _one_by_one(self, run: list[str], out: list[Event]) -> None:
        self._emit_run(out)
        for line in run:
            # Updates taken into the run as they were written may hold colour codes (Rich's highlighter
            # colours the counts).
            self._physical(P.strip_ansi(line), out, cleaned=True)

    def _fold(self, text: str, out: list[Event]) -> None:
        """Plain updates (each line starts with the bar's description and ends with "]")
        into the run's summary: the highest step, the last update, the last loss."""
        rx = self._bar_rx
        lines = text.count("\n") + 1
        cut = text.rfind("\n") + 1
        last = text[cut:]
        # A plain update holds one "%|", one "[" and one "]": counting them checks every line
        # at a fraction of a regex's cost.
        if rx is None or text.count("%|") != lines or text.count("[") != lines or text.count("]") != lines:
            self._one_by_one(text.split("\n"), out)
            return
        if " 0%|" in text:
            # A bar that starts (again) in these lines: its steps need not rise, read them all.
            found = rx.findall(text)
            if len(found) != lines:
                self._one_by_one(text.split("\n"), out)
                return
            steps = [int(n) for n, _ in found]
            top = max(steps)
            top_line = last if steps[-1] == top else text.split("\n")[steps.index(top)]
        else:
            # Within one bar tqdm's count only rises: the highest step is the first or the last.
            first = text[:text.find("\n")] if lines > 1 else last
            fm = rx.match(first)
            lm = rx.match(last)
            if fm is None or lm is None:
                self._one_by_one(text.split("\n"), out)
                return
            a, b = int(fm.group(1)), int(lm.group(1))
            top, top_line = (b, last) if b >= a else (a, first)
        self._bars_begin(out)
        if self._run_max is None or top > self._run_max[0]:
            self._run_max = (top, top_line)
        self._run_last = last
        i = text.rfind("loss=")
        if i >= 0:
            # A finite, non-zero loss in the stretch: the zero-loss streak is over.
            self._zero_steps.clear()
            j = text.find("\n", i)
            self._run_loss_line = text[text.rfind("\n", 0, i) + 1:j if j >= 0 else None]

    def _emit_run(self, out: list[Event]) -> None:
        last = self._run_last
        if last is None:
            return
        top = self._run_max
        loss_line = self._run_loss_line
        self._run_max = self._run_last = self._run_loss_line = None
        if last[:1] == "[":
            last = P.clean(last)
        bar = PR.match_bar(last)
        if bar is None or bar.n is None:
            return
        if top is not None and top[0] > bar.n:
            top_line = P.clean(top[1]) if top[1][:1] == "[" else top[1]
            tb = PR.match_bar(top_line)
            if tb is not None:
                out.append(Progress(step=top[0], total=tb.total, loss=PR.bar_loss(tb.inner), rate=tb.rate,
                                    line=top_line[: tb.end].strip()))
        loss = PR.bar_loss(bar.inner)
        if loss is None and loss_line is not None and loss_line is not last:
            lb = PR.match_bar(P.clean(loss_line) if loss_line[:1] == "[" else loss_line)
            if lb is not None:
                loss = PR.bar_loss(lb.inner)
        out.append(Progress(step=bar.n, total=bar.total, loss=loss, rate=bar.rate, line=last[: bar.end].strip()))

    def _end_bar_run(self, out: list[Event]) -> None:
        if self._run:
            self._summarise_run(out)
        self._emit_run(out)
        self._run_open = False
