"""One progress-bar line read into its numbers, whatever library drew it.

The forms, from each library's own format:

- tqdm with a total: `{desc}: {pct}%|{bar}| {n}/{total} [{elapsed}<{remaining}, {rate}{postfix}]`,
  and the same without the bar where tqdm writes to a notebook or Colab cell. With
  `unit_scale` tqdm writes each count with SI prefixes and three significant figures
  (`format_sizeof`: `5.00`, `30.0`, `999`, `1.02k`, `30.0k`, `1.50M`), the rate too (`3.20kit/s`).
- tqdm without a total (an iterable with no `len`): `{desc}: {n}{unit} [{elapsed}, {rate}{postfix}]`
  (`1021it [00:10, 3.20it/s]`), no percentage and no remaining time.
- Rich's progress columns: the description, a bar of heavy rules (`━`, halves `╸`/`╺`), then a
  percentage (`43%`), `M/N` (`MofNCompleteColumn`) or both, and times (`rich.progress.track`
  prints these).

A scaled count is approximate by construction (`1.02k` is any step from 1015 to 1024): it is read
as written, the nearest whole step.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from kohya_tuner.logparse import patterns as P

# tqdm's SI prefixes, in format_sizeof's order (its divisor for counts is 1000).
_SCALE = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "Z": 10**21,
          "Y": 10**24}
_COUNT = r"\d+(?:\.\d+)?[kMGTPEZY]?"
# tqdm with no total: "steps: 1021it [00:10, 3.20it/s, loss=0.1]", "1.02kit [00:10,  3.20it/s]".
NO_TOTAL_RE = re.compile(
    r"(?P<desc>[^|\r\n\[\]]*?:)?\s*(?P<n>" + _COUNT + r")it \[(?:\d+:)?\d+:\d\d,\s*"
    r"(?P<rate>[\d.]+|\?)(?P<scale>[kMGTPEZY]?)(?P<unit>it/s|s/it)(?P<inner>[^\]\r\n]*)\]"
)
# Rich: "Training ━━━━━━━╸━━━━━━━━━━━━━  43% 0:00:12", "caching ━━━━━━━━━━━ 12/100 0:00:05",
# "steps ━━━━━━━━━━━ 56/100 0:00:10 • 0:00:08 5.21it/s".
# A heavy box's border ("┏━━━━┓", "┡━━━╇━━┩") has rules too but neither figure after them.
RICH_BAR_RE = re.compile(
    r"(?P<desc>[^━╸╺\r\n]*?)\s*[━╸╺]{3,}\s+"
    r"(?:(?P<pct>\d{1,3}(?:\.\d)?)%(?:\s+|$))?(?:(?P<n>\d+)/(?P<total>\d+)(?:\s+|$))?(?P<inner>.*)$"
)
_RICH_RATE_RE = re.compile(r"(?:^|\s)([\d.]+)(it/s|s/it)\b")
# A tqdm bar whose start a paste cut (its description, percentage and part of the bar):
# "| 0/30000 [00:02<?, ?it/s]", "█▌        | 17/400 [00:30<11:20,  1.80s/it, loss=0.1]", or all of
# it up to the counts ("5/1080 [19:43<70:40:10, 236.66s/it, avr_loss=0.133]"). The times in the
# brackets (elapsed<remaining, then the rate) are required, so that a table row ("| 3/4 [done]"), a
# date or a fraction in prose is not taken for one.
HEADLESS_BAR_RE = re.compile(
    r"(?:[ █▉▊▋▌▍▎▏#]*\|)?\s*(?P<n>\d+)/(?P<total>\d+)\s*\[(?:\d+:)?\d+:\d\d<(?:\?|(?:\d+:)?\d+:\d\d),\s*"
    r"(?P<rate>[\d.]+|\?)\s*(?P<unit>it/s|s/it)(?P<inner>[^\]]*)(?:\]|$)")
# tqdm with a `bar_format` that draws the bar before the percentage (the fast-DreamBooth Colab's
# "Progress:|████      | 33% 999/3000 [16:27<32:42,  1.02it/s, loss=0.02]", in later versions with a colon
# after the bar: "Progress:|█         |:   3% 120/4700 […]"); the times are required as in the headless form.
BAR_FIRST_RE = re.compile(
    r"(?P<desc>[^|\r\n]*?)\s*\|[^|\r\n]*\|:?\s*(?P<pct>\d{1,3})%\s+(?P<n>\d+)/(?P<total>\d+)\s*"
    r"\[(?:\d+:)?\d+:\d\d<(?:\?|(?:\d+:)?\d+:\d\d),\s*(?P<rate>[\d.]+|\?)\s*(?P<unit>it/s|s/it)(?P<inner>[^\]]*)(?:\]|$)")
# What such a line starts with (or a digit, with no "|").
HEADLESS_START = frozenset("| █▉▊▋▌▍▎▏#")


class Bar(NamedTuple):
    """A bar update: `n` and `total` in steps (`total` 0 when the bar has none, `n` None when it
    shows only a percentage), `rate` in it/s, `inner` what follows the counts (tqdm's postfix)."""

    desc: str
    n: int | None
    total: int
    inner: str
    rate: float | None
    end: int
    pct: float | None = None


def count(text: str) -> int:
    """A tqdm count as written, `unit_scale` prefixes included ("1.02k" -> 1020)."""
    scale = _SCALE.get(text[-1:], 1) if text[-1:].isalpha() else 1
    number = text[:-1] if scale != 1 or text[-1:].isalpha() else text
    if scale == 1 and "." not in number:
        return int(number)
    return int(round(float(number) * scale))


def _rate(value: str | None, scale: str, unit: str | None) -> float | None:
    if not value or value == "?":
        return None
    try:
        v = float(value) * _SCALE.get(scale or "", 1)
    except ValueError:
        return None
    if unit == "it/s":
        return v
    return 1.0 / v if v > 0 else None


def _from_tqdm(m: re.Match) -> Bar:
    # m.groups(), not named groups, and the common case inline: this runs for every refresh.
    desc, pct, n, total, rate, scale, unit, inner = m.groups()
    speed = None
    if rate and rate != "?":
        speed = _rate(rate, scale, unit) if scale or unit != "it/s" else float(rate)
    # (No inner part where the paste stops right after the counts.)
    return Bar(desc, int(n) if n.isdigit() else count(n), int(total) if total.isdigit() else count(total),
               inner or "", speed, m.end(), int(pct))


def match_bar(line: str) -> Bar | None:
    """The bar at the start of a line, in any of the forms above, else None. A line holding none of
    "%|", "% ", "it [", "━" and a "|" before its counts is none of them (the parser tests that first)."""
    m = P.BAR_RE.match(line)
    if m is not None and (m.group("inner") is not None or "|" in line[m.end("pct"):m.start("n")]):
        # (Counts with no bracket after them are a bar only where tqdm's bar is drawn before them.)
        return _from_tqdm(m)
    if "it [" in line:
        m = NO_TOTAL_RE.match(line)
        if m is not None:
            return Bar(desc=m.group("desc") or "", n=count(m.group("n")), total=0, inner=m.group("inner"),
                       rate=_rate(m.group("rate"), m.group("scale"), m.group("unit")), end=m.end())
    if "━" in line:
        m = RICH_BAR_RE.match(line)
        if m is not None and (m.group("pct") or m.group("n")):
            inner = m.group("inner")
            r = _RICH_RATE_RE.search(inner)
            return Bar(desc=m.group("desc"), n=int(m.group("n")) if m.group("n") else None,
                       total=int(m.group("total") or 0), inner=inner,
                       rate=_rate(r.group(1), "", r.group(2)) if r else None, end=m.end(),
                       pct=float(m.group("pct")) if m.group("pct") else None)
    if "|" in line and "% " in line:
        m = BAR_FIRST_RE.match(line)
        if m is not None:
            return Bar(desc=m.group("desc"), n=int(m.group("n")), total=int(m.group("total")), inner=m.group("inner"),
                       rate=_rate(m.group("rate"), "", m.group("unit")), end=m.end(), pct=int(m.group("pct")))
    if line[:1] in HEADLESS_START or line[:1].isdigit():
        m = HEADLESS_BAR_RE.match(line)
        if m is not None:
            return Bar(desc="", n=int(m.group("n")), total=int(m.group("total")), inner=m.group("inner"),
                       rate=_rate(m.group("rate"), "", m.group("unit")), end=m.end())
    return None


def bar_loss(inner: str) -> float | None:
    """The training loss a bar's postfix reports: sd-scripts' `avr_loss=`, a bare `loss=`,
    ai-toolkit's `loss: 4.1e-01`; never a validation loss (`val_avg_loss=`)."""
    i = inner.find("loss=")
    # String slicing, not a regex: this runs for every bar refresh of a long run.
    while i >= 0:
        if i == 0 or inner[i - 1] in " ," or inner[i - 4:i] == "avr_":
            end = inner.find(",", i)
            try:
                return float(inner[i + 5:end if end >= 0 else None])
            except ValueError:
                return None
        i = inner.find("loss=", i + 5)
    i = inner.find("loss: ")
    while i >= 0:
        if i == 0 or inner[i - 1] == " ":
            token = inner[i + 6:].split(None, 1)
            try:
                return float(token[0].rstrip(",")) if token else None
            except ValueError:
                return None
        i = inner.find("loss: ", i + 6)
    return None
