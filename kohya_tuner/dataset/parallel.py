"""Run per-image work across CPU cores, in order, with progress and a clean Ctrl-C."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, Callable, Sequence

# Below this many items, starting worker processes costs more than it saves.
MIN_PARALLEL = 16


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _ignore_sigint() -> None:
    # Ctrl-C reaches every process in the terminal's group. Workers ignore it and finish
    # the file in hand (each write is atomic), while the parent stops handing out work.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _context():
    # fork is the cheapest and needs nothing from the main module, but is unsafe once
    # the parent has threads (a VRAM sampler, say); then forkserver on Linux, spawn
    # elsewhere (macOS system libraries do not survive fork).
    methods = multiprocessing.get_all_start_methods()
    if sys.platform.startswith("linux"):
        if threading.active_count() == 1 and "fork" in methods:
            return multiprocessing.get_context("fork")
        if "forkserver" in methods:
            return multiprocessing.get_context("forkserver")
    return multiprocessing.get_context("spawn")


def parallel_map(fn: Callable[[Any], Any], items: Sequence[Any], *, workers: int | None = None,
                 progress: Callable[[int, int, int], None] | None = None,
                 on_result: Callable[[int, Any], None] | None = None) -> list[Any]:
    """[fn(x) for x in items], spread over processes when worthwhile.

    `progress(done, total, index)` and `on_result(index, result)` run in this process
    as each item finishes. `fn` must be a module-level function. On KeyboardInterrupt
    (or any exception from a callback) no new items start, those running finish, and the
    exception propagates."""
    total = len(items)
    results: list[Any] = [None] * total
    n_workers = min(workers or default_workers(), total)

    def finished(i: int, value: Any, done: int) -> None:
        results[i] = value
        if on_result:
            on_result(i, value)
        if progress:
            progress(done, total, i)

    if n_workers <= 1 or total < MIN_PARALLEL:
        for i, item in enumerate(items):
            finished(i, fn(item), i + 1)
        return results

    pool = ProcessPoolExecutor(max_workers=n_workers, mp_context=_context(), initializer=_ignore_sigint)
    pending: dict[Future, int] = {}
    next_i = 0
    done = 0
    # A bounded window keeps memory flat and lets an interrupt stop within a few files.
    window = n_workers * 4
    try:
        while next_i < total or pending:
            while next_i < total and len(pending) < window:
                pending[pool.submit(fn, items[next_i])] = next_i
                next_i += 1
            completed, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in completed:
                i = pending.pop(fut)
                done += 1
                finished(i, fut.result(), done)
    except BaseException:
        for fut in pending:
            fut.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
        # Work that finished while stopping is real (its files exist): report it too.
        for fut, i in pending.items():
            if fut.done() and not fut.cancelled() and fut.exception() is None and on_result:
                try:
                    results[i] = fut.result()
                    on_result(i, results[i])
                except Exception:
                    pass
        raise
    pool.shutdown(wait=True)
    return results
