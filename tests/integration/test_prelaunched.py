"""The session's launch pool (realtrainer_launch.Prelaunched) on jobs that only wait, no trainer: what
fits beside what, in which order, and what a test reading a job's result gets."""

from __future__ import annotations

import os
import threading

import pytest
from realtrainer_launch import Prelaunched


@pytest.fixture
def pool():
    p = Prelaunched()
    p._budget = 20.0  # the 24 GB machine's: a large job (11.5) fits beside a small one (6.5), not another large
    yield p
    p.close()


def _job(started: list, release: threading.Event):
    def job(name, extra_env=None):
        started.append((name, extra_env["OMP_NUM_THREADS"]))
        assert release.wait(30)
        return name
    return job


def test_a_large_job_waiting_for_room_does_not_hold_back_a_small_one(pool):
    if pool.n < 2:
        pytest.skip("one worker: nothing runs beside anything")
    started, first, rest = [], threading.Event(), threading.Event()
    pool.submit("large-1", 11.5, _job(started, first), "large-1")
    pool.submit("large-2", 11.5, _job(started, rest), "large-2")
    pool.submit("small", 6.5, _job(started, rest), "small")
    rest.set()  # the small one may finish at once; large-1 holds its worker until `first`
    assert pool.result("small") == "small"
    assert {name for name, _ in started} == {"large-1", "small"}
    assert "large-2" not in [name for name, _ in started]  # 23 GiB beside large-1: waits for room
    first.set()
    assert pool.result("large-2") == "large-2" and pool.result("large-1") == "large-1"
    assert started[-1] == ("large-2", str(os.cpu_count()))  # alone now: every core


def test_a_job_that_raises_raises_in_the_test_that_reads_it_and_close_drops_what_never_started(pool):
    release = threading.Event()

    def boom(extra_env=None):
        raise ValueError("the launch failed")

    pool.submit("boom", 1.0, boom)
    with pytest.raises(ValueError, match="the launch failed"):
        pool.result("boom")
    started: list = []
    for i in range(pool.n + 1):  # one more than the workers: it cannot start before they are free
        pool.submit(f"wait-{i}", 1.0, _job(started, release), f"wait-{i}")
    while len(started) < pool.n:
        threading.Event().wait(0.01)
    closing = threading.Thread(target=pool.close)
    closing.start()
    while not pool._closed:
        threading.Event().wait(0.01)
    release.set()
    closing.join(30)
    assert not closing.is_alive()
    assert pool._jobs[f"wait-{pool.n}"].cancelled()
    assert [pool.result(f"wait-{i}") for i in range(pool.n)] == [f"wait-{i}" for i in range(pool.n)]
