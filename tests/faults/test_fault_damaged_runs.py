"""A damaged run folder given to `run --continue`: exit 2 with one paragraph, or a
continuation that is right, never a traceback. Damaged run.json and attempts.jsonl are
generated (hypothesis); a journal that lost its last line, a supervisor killed unseen
and state files with impossible step counts are built by hand."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from PIL import Image

from kohya_tuner.run import durable
from kohya_tuner.run.journal import AttemptRecord, Journal, valid_step
from kohya_tuner.run.states import AttemptOutput, newest_resumable, settle_unfinished, states_on_disk
from tests.clihelp import invoke
from tests.statefiles import write_state

REPO = Path(__file__).resolve().parents[2]
# As in test_fuzz_cli.py: fixed examples in the suite; KT_FUZZ_RANDOM=1 KT_FUZZ_SCALE=N hunts.
_SCALE = max(1, int(os.environ.get("KT_FUZZ_SCALE", "1") or 1))
DAMAGE = settings(max_examples=60 * _SCALE, deadline=None, derandomize=not os.environ.get("KT_FUZZ_RANDOM"),
                  database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
STANDIN = REPO / "tests" / "standin"
EXAMPLES: Counter = Counter()


@pytest.fixture(scope="module", autouse=True)
def _count_examples():
    """Prints how many generated examples ran (pytest -s), for the hunting figures."""
    yield
    if EXAMPLES:
        print(f"\ndamaged-run examples run: {sum(EXAMPLES.values())} — "
              + ", ".join(f"{k} {v}" for k, v in sorted(EXAMPLES.items())))


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """A run folder as `run --dry-run` leaves it; tests copy it before damaging it."""
    tmp = tmp_path_factory.mktemp("planned")
    data = tmp / "imgs"
    data.mkdir()
    for i in range(4):
        Image.new("RGB", (512, 512), (30 * i, 90, 10)).save(data / f"i{i}.png")
    base = tmp / "base.safetensors"
    base.write_bytes(b"\0" * 64)
    out = tmp / "run"
    res = invoke("run", "--model", "sd15", "--job", "style", "--gpu", "8", "--cpu", "--data", data, "--out", out,
                 "--sd-scripts", STANDIN, "--steps", "40", "--base", base, "--dry-run")
    assert res.exit_code == 0, res.output
    return out


def _copy(src: Path, dst: Path) -> Path:
    """The planned run as if it had been planned in `dst`: its records name their own folder (a
    folder copied as it is would be continued into the original, which --continue refuses)."""
    import shutil

    shutil.copytree(src, dst)
    for name in ("run.json", "attempts.jsonl"):
        f = dst / name
        if f.is_file():
            f.write_text(f.read_text(encoding="utf-8").replace(str(src), str(dst)), encoding="utf-8")
    return dst


class Hung(BaseException):
    """Not TimeoutError: the CLI turns an OSError into an exit-2 paragraph."""


def _continue(out: Path, *extra: str):
    def fire(signum, frame):
        raise Hung("run --continue did not return within 10 s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(10)
    try:
        res = invoke("run", "--continue", out, "--dry-run", *extra)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert "Traceback" not in res.output
    return res


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                           lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids,
                                                                                     max_size=3), max_leaves=8)
FIELDS = ["family", "script", "python", "plan_config", "total_steps", "dataset_file", "num_processes", "gpu_ids",
          "gpu_index", "max_attempts", "hang_minutes", "probe_steps", "policy", "emulate_vram_gb", "dataset"]


@DAMAGE
@given(whole=st.one_of(st.none(), json_values), field=st.sampled_from(FIELDS), value=json_values,
       drop=st.booleans(), mode=st.sampled_from(["whole", "field", "bytes"]), raw=st.binary(max_size=64))
def test_a_damaged_run_json_is_one_paragraph(planned, tmp_path_factory, whole, field, value, drop, mode, raw):
    out = _copy(planned, tmp_path_factory.mktemp("d") / "run")
    run = json.loads((out / "run.json").read_text())
    if mode == "whole":
        text = json.dumps(whole)
    elif mode == "field":
        if drop:
            run.pop(field, None)
        else:
            run[field] = value
        text = json.dumps(run)
    else:
        text = None
    if text is None:
        (out / "run.json").write_bytes(raw)
    else:
        (out / "run.json").write_text(text)
    res = _continue(out)
    EXAMPLES["run.json"] += 1
    assert res.exit_code in (0, 2), res.output
    if res.exit_code == 2:
        assert "error:" in res.output


@DAMAGE
@given(lines=st.lists(st.one_of(st.binary(max_size=40), json_values.map(lambda v: json.dumps(v).encode())),
                      max_size=5))
def test_a_damaged_attempts_journal_is_read_past(planned, tmp_path_factory, lines):
    out = _copy(planned, tmp_path_factory.mktemp("d") / "run")
    (out / "attempts.jsonl").write_bytes(b"\n".join(lines))
    res = _continue(out, "--json")
    EXAMPLES["attempts.jsonl"] += 1
    assert res.exit_code in (0, 2), res.output
    if res.exit_code == 0:
        assert json.loads(res.stdout)["attempt"] >= 1


@pytest.fixture(scope="module")
def with_states(planned, tmp_path_factory):
    """The planned run after an attempt that saved states at 10 and 20 (its journal line,
    log and pending record on disk), so every reader of a run folder has a file to read."""
    out = _copy(planned, tmp_path_factory.mktemp("states") / "run")
    run = json.loads((out / "run.json").read_text())
    run["plan_config"]["output_dir"] = str(out / "output")  # its own, so each example's copy has its states
    (out / "run.json").write_text(json.dumps(run))
    output, name = out / "output", run["plan_config"]["output_name"]
    for step in (10, 20):
        write_state(output / f"{name}-step{step:08d}-state", step)
    Journal(out).append(_record(1, "oom", 0, 20, resume_from=None))
    (out / "attempt-1.log").write_text("steps:  50%|#  | 20/40\n")
    (out / "attempt-2.log").write_text("attempt 2, its line lost\n")
    (out / "attempt-3.pending.json").write_text("{}")
    (out / "summary.json").write_text("{}")
    return out


SPECIALS = ["fifo", "device link", "dangling link", "folder", "empty", "garbage"]


@DAMAGE
@given(data=st.data())
def test_a_run_folder_with_special_files_is_read_past_or_refused(with_states, tmp_path_factory, data):
    """Any of its files (the journal, run.json, a state's train_state.json or model, a
    pending record, a log) a FIFO, a link to a device or to nothing, a folder, empty or
    garbage, one or several at once: exit 0 or 2 within 10 s, never a traceback."""
    out = tmp_path_factory.mktemp("s") / "run"
    _copy(with_states, out)
    run = json.loads((out / "run.json").read_text())
    run["plan_config"]["output_dir"] = str(out / "output")
    (out / "run.json").write_text(json.dumps(run))
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    for rel in data.draw(st.lists(st.sampled_from(files), min_size=1, max_size=3, unique=True)):
        p = out / rel
        kind = data.draw(st.sampled_from(SPECIALS))
        p.unlink()
        if kind == "fifo":
            os.mkfifo(p)
        elif kind == "device link":
            p.symlink_to("/dev/zero")
        elif kind == "dangling link":
            p.symlink_to(p.parent / "nowhere")
        elif kind == "folder":
            p.mkdir()
        else:
            p.write_bytes(b"" if kind == "empty" else data.draw(st.binary(max_size=64)))
    res = _continue(out)
    EXAMPLES[f"special files, exit {res.exit_code}"] += 1
    assert res.exit_code in (0, 2), res.output


@pytest.mark.parametrize("text", ["[]", "null", '{"plan_config": null}', "{}", "\"x\"", "[" * 5000])
def test_named_damage_to_run_json(planned, tmp_path, text):
    out = _copy(planned, tmp_path / "run")
    (out / "run.json").write_text(text)
    res = _continue(out)
    assert res.exit_code == 2 and "run.json" in res.output, res.output


@pytest.mark.parametrize("summary", [b"[]", b"\xff\xfe\x00", b"null", b'{"status": 5}', b"[" * 5000])
def test_a_damaged_summary_does_not_stop_continue(planned, tmp_path, summary):
    out = _copy(planned, tmp_path / "run")
    (out / "summary.json").write_bytes(summary)
    res = _continue(out)
    assert res.exit_code == 0, res.output


def _record(n: int, outcome: str, start: int, end: int, **kw) -> AttemptRecord:
    return AttemptRecord(attempt=n, started="now", config_file=f"attempt-{n}.config.toml",
                         log_file=f"attempt-{n}.log", reason="r", outcome=outcome, start_step=start, end_step=end,
                         **kw)


def test_a_journal_that_lost_its_last_line_never_reuses_that_attempt(planned, tmp_path):
    out = _copy(planned, tmp_path / "run")
    settings_ = json.loads((out / "run.json").read_text())
    output = Path(settings_["plan_config"]["output_dir"])
    name = settings_["plan_config"]["output_name"]
    Journal(out).append(_record(1, "interrupted", 0, 10, resume_from=None))
    write_state(output / f"{name}-step00000010-state", 10)
    # Attempt 2 resumed from step 10 (30 left), saved its step-20 state (its own count
    # 20 -> absolute 30), and its journal line never came.
    (out / "attempt-2.log").write_text("attempt 2's log\n")
    (out / "attempt-2.config.toml").write_text(f'resume = "{output}/{name}-step00000010-state"\n'
                                               f'max_train_steps = 30\noutput_name = "{name}-attempt2"\n')
    write_state(output / f"{name}-attempt2-step00000020-state", 20)
    res = _continue(out, "--json")
    assert res.exit_code == 0, res.output
    preview = json.loads(res.stdout)
    assert preview["attempt"] == 3 and preview["log_file"].endswith("attempt-3.log")
    assert preview["start_step"] == 30 and preview["start_step"] < settings_["total_steps"]
    assert (out / "attempt-2.log").read_text() == "attempt 2's log\n"
    # The lost attempt's steps still count: 10, then 20 more from its states.
    from kohya_tuner.run.continuation import recovered_records
    from kohya_tuner.run.journal import summarize
    from kohya_tuner.run.settings import RunSettings

    j = Journal(out)
    records = recovered_records(RunSettings.from_json(out, j.read_run()), j.attempts())
    assert [(a.attempt, a.start_step, a.end_step) for a in records] == [(1, 0, 10), (2, 10, 30)]
    summary = summarize(records, status="interrupted", reason="r", total_steps=40, final_config=None,
                        plan_config=None, lora_path=None)
    assert (summary["steps_done"], summary["reached_step"], summary["steps_redone"]) == (30, 30, 0)


def test_a_log_with_no_record_keeps_its_number(tmp_path):
    j = Journal(tmp_path)
    j.append(_record(1, "oom", 0, 5))
    (tmp_path / "attempt-2.log").write_text("x")
    assert j.next_attempt_number() == 3
    (tmp_path / "attempt-4.config.toml").write_text("")  # prepared by a dry run, never launched
    assert j.next_attempt_number() == 3


def test_steps_of_an_attempt_killed_unseen_come_from_its_states(tmp_path):
    output = tmp_path / "output"
    plan = {"output_dir": str(output), "output_name": "lora"}
    write_state(output / "lora-step00000028-state", 28)
    write_state(output / "lora-step00000036-state", 36)
    pending = _record(1, "running", 0, 0)
    settled = settle_unfinished([pending], plan, 40)
    assert settled[0].end_step == 36 and len(settled[0].states) == 2
    # A finished record is the journal's word; it is not rewritten.
    assert settle_unfinished([_record(1, "oom", 0, 30)], plan, 40)[0].end_step == 30


@pytest.mark.parametrize("step", [1e23, -3, "12", True, 10**23, None, 41])
def test_a_step_count_past_the_plan_or_not_a_count_is_not_believed(tmp_path, step):
    output = tmp_path / "output"
    d = write_state(output / "lora-step00000012-state", 12)
    (d / "train_state.json").write_text(json.dumps({"current_epoch": 1, "current_step": step}))
    outs = [AttemptOutput(1, "lora", 0)]
    assert newest_resumable(output, outs, 40) is None
    assert states_on_disk(output, outs, 40) == []


def test_valid_step_takes_only_counts():
    assert [valid_step(v) for v in (0, 5, 10**9)] == [0, 5, 10**9]
    assert [valid_step(v) for v in (-1, 1.0, True, "3", 10**9 + 1, float("nan"))] == [None] * 6


def test_a_pending_record_that_is_not_a_record_is_skipped(tmp_path):
    (tmp_path / "attempt-2.pending.json").write_text("[]")
    (tmp_path / "attempt-3.pending.json").write_bytes(b"\xff\xfe")
    assert durable.pending_records(tmp_path, set(), AttemptRecord.from_json) == []


def test_a_new_run_never_writes_over_a_log_whose_record_was_lost(planned, tmp_path):
    out = _copy(planned, tmp_path / "run")
    (out / "attempt-1.log").write_text("the only record of attempt 1\n")
    res = invoke("run", "--model", "sd15", "--job", "style", "--gpu", "8", "--cpu", "--data",
                 planned.parent / "imgs", "--out", out,
                 "--sd-scripts", STANDIN, "--steps", "40", "--base", planned.parent / "base.safetensors")
    assert res.exit_code == 2 and "--continue" in res.output, res.output
    assert (out / "attempt-1.log").read_text() == "the only record of attempt 1\n"
