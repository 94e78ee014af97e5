"""The integration suite on the real, pinned sd-scripts (marker `realtrainer`).

It needs the harness that ../shared/realtrainer/build.sh makes, named by the variables
that script prints; without them every test here is skipped with the reason. At the end
the suite prints one line per scenario: optimizer steps planned, trained (counted by the
fault-injection ledger, not from logs) and redone, attempts, wall seconds, and the peak RSS of
the CLI with every trainer process under it, summed; and every launch the pool ran, slowest first, with
the worker seconds they took together (the suite's time is what keeps CI inside its limit).
"""

from __future__ import annotations

import json
import os

import pytest
from harness import SCENARIOS
from realtrainer_launch import Prelaunched, Queue, session_modules

# The session's pool (conftest's `prelaunched`), for the summary of its launches.
SESSION_POOLS: list[Prelaunched] = []

VARS = ("KOHYA_TUNER_REAL_SDSCRIPTS", "KOHYA_TUNER_REAL_PYTHON", "KOHYA_TUNER_REAL_MODEL",
        "KOHYA_TUNER_REAL_TOKCACHE", "KOHYA_TUNER_REAL_DATA")

def pytest_collection_modifyitems(config, items):
    missing = [v for v in VARS if not os.environ.get(v)]
    if not missing:
        return
    skip = pytest.mark.skip(reason=f"the real-trainer harness is not configured ({', '.join(missing)} unset); "
                                   "build it with ../shared/realtrainer/build.sh and export what it prints")
    for item in items:
        if "realtrainer" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def prelaunched(request, tmp_path_factory):
    """Every real launch the session's selected tests need, submitted at once to one Prelaunched
    pool: each module's `prelaunch(queue, cases, tmp_path_factory)` submits its own, in test order,
    and returns what its tests need to find them; module name -> (its Queue, that).

    Modules whose jobs are whole scenarios (`LONG_JOBS`: several launches each, minutes) submit
    first, so the session does not end on one of them running alone while the other worker idles;
    the tests still run, and report, in their own order."""
    pool, made = Prelaunched(), {}
    SESSION_POOLS.append(pool)
    modules = session_modules(request.session)
    try:
        for module in sorted(modules, key=lambda m: not getattr(m, "LONG_JOBS", False)):
            cases = modules[module]
            queue = Queue(pool, module.__name__)
            made[module.__name__] = (queue, module.prelaunch(queue, cases, tmp_path_factory))
        yield made
    finally:
        pool.close()


def pytest_terminal_summary(terminalreporter):
    times = [row for pool in SESSION_POOLS for row in pool.times]
    if times:
        terminalreporter.section("real trainer: launches, slowest first")
        total = sum(s for _, s, _ in times)
        terminalreporter.write_line(f"{len(times)} launches, {total:.0f} s of worker time")
        for name, seconds, threads in sorted(times, key=lambda r: -r[1]):
            terminalreporter.write_line(f"{seconds:7.1f}s  threads {threads}  {name}")
    if not SCENARIOS:
        return
    terminalreporter.section("real trainer: optimizer steps per scenario")
    for row in SCENARIOS:
        terminalreporter.write_line(
            f"{row['scenario']:<44} planned {row['planned']:>3}  trained {row['trained']:>3}  "
            f"redone {row['redone']:>3}  attempts {row['attempts']}  {row['wall_s']:>6.1f}s  "
            f"peak RSS {row.get('peak_rss_gib', 0):>5.2f} GiB")
    path = os.environ.get("KOHYA_TUNER_REAL_SUMMARY")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(SCENARIOS, f, indent=1)
