"""Non-finite numbers never reach a JSON reader as NaN/Infinity (strict parsers reject
them) and never crash the report: one encoder (kohya_tuner/jsontext.py) writes them as
null for every --json output and journal file; the report marks a diverged loss."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, strategies as st

from kohya_tuner import jsontext
from kohya_tuner.run import report
from kohya_tuner.run.journal import AttemptRecord, Journal, summarize
from tests.clihelp import invoke


def _strict(text: str):
    def refuse(name):
        raise AssertionError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


BAD = [math.nan, math.inf, -math.inf]


@given(st.recursive(st.floats() | st.integers() | st.text(max_size=4) | st.none(),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=4), kids, max_size=4),
                    max_leaves=20))
def test_the_encoder_always_writes_strict_json(data):
    _strict(jsontext.dumps(data))


def test_the_encoder_writes_null_for_each_non_finite_number():
    assert _strict(jsontext.dumps({"a": BAD, "b": (1.5, math.nan)})) == {"a": [None] * 3, "b": [1.5, None]}


def _log(loss: str) -> str:
    return ("running training / 学習開始\n  total optimization steps / 学習ステップ数: 10\n"
            + "".join(f"\rsteps:  {i * 10}%|▌  | {i}/10 [00:10<01:00, 1.50s/it, avr_loss={loss}]" for i in (1, 2, 3))
            + "\n")


@pytest.mark.parametrize("loss", ["nan", "inf", "-inf", "0.25"])
def test_diagnose_json_is_strict(tmp_path, loss):
    log = tmp_path / "train.log"
    log.write_text(_log(loss), encoding="utf-8")
    for extra in ([], ["--events"]):
        res = invoke("diagnose", log, "--json", *extra)
        assert res.exit_code in (0, 1), res.output
        lines = res.stdout.splitlines()
        start = lines.index("{")  # the object; any event lines come before it, one per line
        for line in lines[:start]:
            _strict(line)
        assert not extra or start > 0
        _strict("\n".join(lines[start:]))


def _attempt(loss_values, vram=None) -> AttemptRecord:
    return AttemptRecord(attempt=1, started="now", config_file="c", log_file="l", reason="r", outcome="error",
                         end_step=len(loss_values), loss=[[float(i), float(i + 1), v] for i, v in enumerate(loss_values)],
                         vram=vram or [[0.0, 1.0], [1.0, math.nan], [2.0, math.inf]], peak_vram_gib=math.nan)


@pytest.mark.parametrize("values", [[0.5, math.nan, math.nan], [math.inf] * 3, [math.nan], [0.3, -math.inf, 0.2]])
def test_a_non_finite_loss_gives_a_report_and_strict_journal_files(tmp_path, values):
    a = _attempt(values)
    html = report.render({"status": "error", "reason": "nan loss", "total_steps": 10}, [a])
    assert "<svg" in html and "not a number" in html
    j = Journal(tmp_path)
    j.append(a)
    summary = summarize([a], status="error", reason="r", total_steps=10, final_config={"x": math.nan},
                        plan_config={"x": 1.0}, lora_path=None)
    j.write_summary(summary)
    for line in j.attempts_path.read_text().splitlines():
        _strict(line)
    _strict(j.summary_path.read_text())
    # Read back (nulls where the loss diverged), the report still renders.
    again = j.attempts()
    assert "<svg" in report.render({"status": "error", "reason": "r", "total_steps": 10}, again)
