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


def test_a_run_whose_loss_becomes_nan_has_its_report_and_strict_files(tmp_path):
    """The case run exists to diagnose, end to end on the stand-in (through accelerate
    launch): the loss is NaN from step 3 of 8. Every journal file and event is strict JSON,
    report.html is written and marks where the loss stopped being a number, diagnose names
    it, and --continue does not repeat a crash."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from PIL import Image

    repo = Path(__file__).resolve().parents[2]
    data = tmp_path / "imgs"
    data.mkdir()
    for i in range(4):
        Image.new("RGB", (512, 512), (40 * i, 9, 9)).save(data / f"{i}.png")
    base = tmp_path / "base.safetensors"
    base.write_bytes(b"\0" * 64)
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STANDIN_", "ACCELERATE_"))}
    env.update(KOHYA_TUNER_HOME=str(tmp_path / "home"), STANDIN_STEP_SECONDS="0.005", STANDIN_NAN_AT_STEP="3",
               PYTHONPATH=str(repo))

    def kt(*args):
        return subprocess.run([sys.executable, "-m", "kohya_tuner", *map(str, args)], env=env, capture_output=True,
                              text=True, timeout=240, cwd=tmp_path)

    res = kt("run", "-m", "sd15", "-j", "style", "-g", "8", "--cpu", "--data", data, "--out", out, "--sd-scripts",
             repo / "tests" / "standin", "--steps", "8", "--base", base, "--json-events", tmp_path / "ev.jsonl")
    assert res.returncode == 1, res.stdout + res.stderr  # a NaN loss stops the run (docs/run.md)
    assert "avr_loss=nan" in (out / "attempt-1.log").read_text()
    for name in ("run.json", "summary.json"):
        _strict((out / name).read_text())
    for line in [*(out / "attempts.jsonl").read_text().splitlines(), *(tmp_path / "ev.jsonl").read_text().splitlines()]:
        _strict(line)
    html = (out / "report.html").read_text()
    assert "not a number" in html
    diag = kt("diagnose", out / "attempt-1.log", "--json")
    assert _strict(diag.stdout)["error"]["kind"] == "nan_loss", diag.stdout
    again = kt("run", "--continue", out)
    assert again.returncode == 2 and "Traceback" not in again.stdout + again.stderr, again.stderr
