"""Other trainers' milestone words and the names that say a phase (phase_words.toml).

Pure lookups; the words are data so that a trainer's new message is one entry, not a branch.
Loaded once, on first use.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

_TABLE = Path(__file__).with_name("phase_words.toml")
# A script a command line runs: "python src/musubi_tuner/wan_cache_latents.py --…".
SCRIPT_RE = re.compile(r"([\w\-]+)\.py\b")
# Leading tags of a record (SimpleTuner's "(VAECache) (Rank: 0) message").
# Leading bracketed tags of a record: "[logging.py:96:log_dist] [Rank 0] message"; not bash's prompt
# ("[user@host dir]$ …"), which is read with the command after it.
BRACKETS_RE = re.compile(r"(?!\[[\w.\-]+@[^\]\n]*\][$#])(?:\[[^\]\n]{1,48}\]:?\s*)+")
# A "(key=value)" tag (SimpleTuner's "(id=my-dataset)") names an object, not a phase; "(step=0001005)" is the
# step a record reports, read with the record.
TAGS_RE = re.compile(
    r"(?:\((?P<tag>[\w.]+)\)\s*|\((?:rank|Rank):?\s*\d+\)\s*|\((?!(?:global_)?steps?=)[\w.\-]{1,32}=[^()\s]{1,64}\)\s*)+")


@lru_cache(maxsize=1)
def _data() -> dict:
    return tomllib.loads(_TABLE.read_text(encoding="utf-8"))


def prefixes() -> tuple[tuple[str, str, str], ...]:
    """(lower-case message prefix, phase, milestone name) of the trainers other than sd-scripts."""
    return tuple((r["text"], r["phase"], r["name"]) for r in _data()["prefix"])


@lru_cache(maxsize=1)
def _sources() -> tuple[tuple[re.Pattern, str, str], ...]:
    return tuple((re.compile(r["match"]), r["phase"], r["name"]) for r in _data()["source"])


@lru_cache(maxsize=256)
def source_phase(name: str) -> tuple[str, str] | None:
    """(phase, milestone name) when the name of what logged a record says the phase, else None."""
    low = name.lower()
    for rx, phase, what in _sources():
        if rx.search(low):
            return phase, what
    return None


def command_phase(low: str) -> tuple[str, str] | None:
    """(phase, milestone name) when a lower-cased command line runs a script whose name says
    the phase (a caching script) or starts a job (a training script, a shell script run from a
    prompt), else None."""
    # (A command wrapped with backslashes names its script on a line of its own: "  x.py \".)
    py = ".py" in low and ("python" in low or "accelerate" in low or "launch" in low
                           or low.rstrip(" \\").endswith(".py"))
    if not py and ".sh" not in low and not ("launch" in low or "torchrun" in low or "deepspeed" in low):
        return None
    m = SCRIPT_RE.search(low) if py else None
    found = source_phase(m.group(1)) if m else None
    if found is None and (m is not None or not py):
        for rx, phase, what in _launches():
            if rx.match(low):
                return phase, what
    return found


@lru_cache(maxsize=1)
def _launches() -> tuple[tuple[re.Pattern, str, str], ...]:
    return tuple((re.compile(r["match"]), r["phase"], r["name"]) for r in _data().get("launch", ()))


@lru_cache(maxsize=1)
def _phrases() -> tuple[tuple[str, re.Pattern, str, str], ...]:
    return tuple((r["needle"], re.compile(r["match"]), r["phase"], r["name"]) for r in _data().get("phrase", ()))


@lru_cache(maxsize=1)
def process_phrases() -> frozenset[str]:
    """The milestone names of [[phrase]] entries marked `process`: a pass run as a process of its own,
    whose loading and dataset reading are the pass's."""
    return frozenset(r["name"] for r in _data().get("phrase", ()) if r.get("process", False))


@lru_cache(maxsize=1)
def phrase_needles() -> tuple[str, ...]:
    """The words a message must hold for any [[phrase]] entry to be tried (a cheap first test)."""
    return tuple({r["needle"] for r in _data().get("phrase", ())})


def phrase_phase(low: str) -> tuple[str, str] | None:
    """(phase, milestone name) when a lower-cased message matches a [[phrase]] entry (words
    that say the phase but not at the message's start), else None."""
    for needle, rx, phase, what in _phrases():
        if needle in low and rx.search(low):
            return phase, what
    return None


@lru_cache(maxsize=1)
def bars_after() -> tuple[tuple[str, str, str], ...]:
    """(lower-case description of the bar before, phase, milestone name) for a nameless bar."""
    return tuple((r["after"], r["phase"], r["name"]) for r in _data().get("bar_after", ()))


@lru_cache(maxsize=1)
def before_training() -> tuple[str, ...]:
    """Lower-case words announcing the pass run right before the first training step."""
    return tuple(r["text"] for r in _data().get("before_training", ()))
