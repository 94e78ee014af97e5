"""The journal keeps what happened: a pending record counts until its final line lands,
and a full disk still takes the records that say why the run stopped."""

from __future__ import annotations

import json

from tests.faults.conftest import fill
from kohya_tuner.run import durable
from kohya_tuner.run.journal import AttemptRecord, Journal, StateRecord


def _record(n: int, outcome: str = "running") -> AttemptRecord:
    return AttemptRecord(attempt=n, started="now", config_file="c", log_file=f"attempt-{n}.log", reason="r",
                         outcome=outcome)


def test_a_pending_record_counts_until_the_final_line_replaces_it(tmp_path):
    j = Journal(tmp_path)
    j.append(_record(1, "oom"))
    rec = _record(2)
    durable.write_pending(tmp_path, rec)
    assert [(a.attempt, a.outcome) for a in j.attempts()] == [(1, "oom"), (2, "running")]
    assert j.next_attempt_number() == 3  # attempt-2.log is never reused

    class P:
        step, states = 7, [StateRecord(path="s7", step=7, attempt=2)]

    durable.write_pending(tmp_path, durable.snapshot(rec, P, "interrupted"))
    got = j.attempts()[-1]
    assert (got.outcome, got.end_step, got.states[0].step) == ("interrupted", 7, 7)
    j.append(_record(2, "interrupted"))
    assert not durable.pending_path(tmp_path, 2).exists()
    lines = (tmp_path / "attempts.jsonl").read_text().splitlines()
    assert [json.loads(x)["attempt"] for x in lines] == [1, 2]  # one line per attempt


def test_a_full_disk_still_takes_the_final_record_and_summary(tiny_disk):
    j = Journal(tiny_disk)
    assert durable.make_reserve(tiny_disk, size=192 * 1024)
    fill(tiny_disk, leave=0)
    j.append(_record(1, "error"))
    j.write_summary({"status": "failed", "reason": "the disk is full", "pad": "x" * 20000})
    assert j.attempts()[0].outcome == "error" and j.read_summary()["reason"] == "the disk is full"
    assert not (tiny_disk / durable.RESERVE_NAME).exists()


def test_without_a_reserve_a_full_disk_is_an_oserror_not_a_lie(tiny_disk):
    import errno

    import pytest

    fill(tiny_disk, leave=0)
    with pytest.raises(OSError) as err:
        Journal(tiny_disk).write_summary({"pad": "x" * 50000})
    assert err.value.errno == errno.ENOSPC


def test_a_trainer_that_meets_a_full_disk_is_told_to_free_space_not_to_change_settings():
    from types import SimpleNamespace

    from kohya_tuner.families import get_family
    from kohya_tuner.run.policy import AttemptFacts, RunState, Stop, decide

    diag = SimpleNamespace(outcome="error", phase="training", oom=None, advice=["This is not a memory problem"],
                           error={"kind": "other", "message": "OSError: [Errno 28] No space left on device"})
    state = RunState(attempt=1, attempts_left=3, total_steps=40, plan_config={})
    action = decide(diag, {}, get_family("sd15"), state, AttemptFacts(exit_status=1, end_step=16))
    assert isinstance(action, Stop) and action.reason.startswith("the disk is full")
    assert action.can_continue and "--continue" in action.advice[0]
