"""The log of a run on several ranks names the rank that ran out of memory.

The transcript is the real pinned sd-scripts on two CPU ranks (accelerate's multi-process
launcher, torchrun underneath) with an OOM injected on rank 1 only: rank 1's traceback, rank 0
failing in its gradient all-reduce when its peer went away, torchrun's SIGTERM to rank 0 and
its ChildFailedError summary. Paths were shortened and long runs of spaces squeezed."""

from __future__ import annotations

import re
from pathlib import Path

from kohya_tuner.logparse import LogParser, Oom, diagnose, parse_text

LOG = Path(__file__).parent / "data" / "realtrainer_logs" / "two-ranks-oom-rank1.log"


def test_the_oom_is_rank_1s_and_explains_the_run():
    d = diagnose(parse_text(LOG.read_text(encoding="utf-8")), exit_status=1)
    assert (d.outcome, d.phase, d.step) == ("oom", "training", 2)
    assert d.details.failed_rank == 1 and d.details.processes == 2
    assert any("rank 1 ran out first" in a for a in d.advice), d.advice
    # Rank 0's broken all-reduce and torchrun's SIGTERM are consequences, not other programs.
    assert not any("Free the GPU" in a or "other programs" in a for a in d.advice), d.advice


def test_a_live_reader_sees_the_rank_on_the_oom_event_in_any_chunking():
    data = LOG.read_text(encoding="utf-8")
    for size in (1, 97, 4096):
        p = LogParser()
        events = []
        for i in range(0, len(data), size):
            events += p.feed(data[i:i + size])
        events += p.finish()
        ooms = [e for e in events if isinstance(e, Oom)]
        assert [e.rank for e in ooms] == [1], (size, ooms)


def test_without_rank_prefixes_no_rank_is_named():
    text = re.sub(r"\[rank\d+\]: ?", "", LOG.read_text(encoding="utf-8"))
    d = diagnose(parse_text(text), exit_status=1)
    assert d.outcome == "oom" and d.details.failed_rank is None
