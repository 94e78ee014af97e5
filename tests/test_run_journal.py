from __future__ import annotations

import json
import re
from xml.etree import ElementTree

import pytest

from kohya_tuner.run import report
from kohya_tuner.errors import UserError
from kohya_tuner.run.journal import (AttemptRecord, Change, Journal, StateRecord, newest_state, read_train_state,
                                 summarize, thin)


def _state(tmp_path, name, step, attempt):
    d = tmp_path / name
    d.mkdir()
    (d / "train_state.json").write_text(json.dumps({"current_epoch": 1, "current_step": step}))
    return StateRecord(str(d), step, attempt)


def _two_attempts(tmp_path):
    s1 = _state(tmp_path, "lora-step00000004-state", 4, 1)
    a1 = AttemptRecord(attempt=1, started="t", config_file="c1", log_file="l1", reason="first attempt",
                       start_step=0, end_step=6, total_steps=10, duration_s=30.0, exit_status=1, outcome="oom",
                       phase="training", oom={"tried_gib": 2.0, "free_gib": 1.1},
                       peak_vram_gib=7.6, vram=[[0, 1.0], [10, 7.6]], loss=[[1, 1, 0.3], [2, 6, 0.2]],
                       states=[s1])
    a2 = AttemptRecord(attempt=2, started="t", config_file="c2", log_file="l2",
                       reason="OOM <at> step 6 & \"more\"", changes=[Change("train_batch_size", 2, 1)],
                       resume_from=s1.path, start_step=4, end_step=10, total_steps=10, duration_s=20.0,
                       exit_status=0, outcome="success", peak_vram_gib=6.1, vram=[[0, 1.0], [5, 6.1]],
                       loss=[[1, 5, 0.2], [3, 10, 0.15]], final_model=str(tmp_path / "lora.safetensors"))
    return a1, a2


def test_attempts_round_trip_and_survive_a_torn_last_line(tmp_path):
    j = Journal(tmp_path)
    a1, a2 = _two_attempts(tmp_path)
    j.append(a1)
    j.append(a2)
    with open(j.attempts_path, "a", encoding="utf-8") as fh:
        fh.write('{"attempt": 3, "star')  # a crash mid-write
    back = j.attempts()
    assert [a.attempt for a in back] == [1, 2]
    assert back[0].states[0] == a1.states[0]
    assert back[1].changes == [Change("train_batch_size", 2, 1)]
    assert j.next_attempt_number() == 3


def test_newest_state_ignores_deleted_directories(tmp_path):
    a1, _ = _two_attempts(tmp_path)
    later = _state(tmp_path, "lora-step00000008-state", 8, 1)
    gone = StateRecord(str(tmp_path / "pruned-state"), 9, 1)  # removed by save_last_n_steps_state
    a1.states += [later, gone]
    assert newest_state([a1]) == later
    assert read_train_state(later.path) == {"current_epoch": 1, "current_step": 8}
    assert read_train_state(gone.path) is None


def test_summary_counts_lost_time_and_steps(tmp_path):
    a1, a2 = _two_attempts(tmp_path)
    s = summarize([a1, a2], status="success", reason="done", total_steps=10,
                  final_config={"train_batch_size": 1, "resume": "x", "network_dim": 8},
                  plan_config={"train_batch_size": 2, "network_dim": 8}, lora_path=a2.final_model)
    assert s["attempts"] == 2 and s["failed_attempts"] == 1
    # Attempt 1 reached step 6, attempt 2 resumed from step 4: two optimizer steps were redone,
    # and a third of attempt 1's time with them.
    assert s["steps_lost"] == 2
    assert s["time_lost_s"] == 10.0
    assert s["peak_vram_gib"] == 7.6
    assert s["changed_settings"] == {"train_batch_size": {"plan": 2, "final": 1}}


def test_read_run_missing_is_a_user_error(tmp_path):
    with pytest.raises(UserError):
        Journal(tmp_path / "nothing").read_run()


def test_thin_keeps_ends_and_bounds_length():
    pts = [[i, i] for i in range(5000)]
    out = thin(pts, 100)
    assert len(out) == 100 and out[0] == [0, 0] and out[-1] == [4999, 4999]
    assert thin(pts[:10], 100) == pts[:10]


def test_report_is_self_contained_valid_markup_with_oom_markers(tmp_path):
    a1, a2 = _two_attempts(tmp_path)
    s = summarize([a1, a2], status="success", reason="done", total_steps=10, final_config={"a": 1},
                  plan_config={"a": 2}, lora_path="C:/x <y>.safetensors", gpu={"name": "RTX 3060", "total_gib": 11.8})
    page = report.render(s, [a1, a2], title="style run")
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in page
    # Text from logs and paths is escaped, never markup.
    assert "&lt;at&gt;" in page and "x &lt;y&gt;.safetensors" in page
    svgs = re.findall(r"<svg.*?</svg>", page, flags=re.S)
    assert len(svgs) == 2
    for svg in svgs:
        ElementTree.fromstring(svg)  # well-formed
    # One line per attempt in each chart, and the OOM is marked in both.
    assert sum(svg.count("<polyline") for svg in svgs) == 4
    assert page.count('class="oom"') == 2
    assert "out of memory while training at step 6" in page
    assert "train_batch_size" in page and "card 11.8 GiB" in page


def test_report_without_nvml_says_so(tmp_path):
    a1, a2 = _two_attempts(tmp_path)
    a1.vram, a2.vram = [], []
    page = report.render({"status": "failed"}, [a1, a2])
    assert "NVML was not available" in page
    assert page.count("<svg") == 1


def test_summary_counts_a_restart_as_losing_everything(tmp_path):
    a1, a2 = _two_attempts(tmp_path)
    a2.resume_from, a2.start_step = None, 0
    s = summarize([a1, a2], status="success", reason="done", total_steps=10, final_config=None,
                  plan_config=None, lora_path=None)
    assert s["steps_lost"] == 6 and s["time_lost_s"] == 30.0


def test_a_restart_after_a_resume_throws_away_the_whole_lineage(tmp_path):
    """1 (0->6, OOM) -> 2 resumes at 4 (4->7, OOM) -> 3 restarts from 0: all 9 trained steps are redone."""
    from dataclasses import replace

    a1, a2 = _two_attempts(tmp_path)
    a2 = replace(a2, end_step=7, exit_status=1, outcome="oom", final_model=None)
    a3 = replace(a2, attempt=3, resume_from=None, start_step=0, end_step=10, exit_status=0, outcome="success",
                 final_model=str(tmp_path / "lora.safetensors"))
    s = summarize([a1, a2, a3], status="success", reason="done", total_steps=10, final_config=None,
                  plan_config=None, lora_path=None)
    assert s["steps_redone"] == 6 + 3 and s["steps_done"] == 6 + 3 + 10


@pytest.mark.parametrize("resumed_at, redone", [(4, 2), (0, 6)])
def test_steps_after_the_state_an_interrupted_attempt_resumes_from_are_redone(tmp_path, resumed_at, redone):
    """1 (0->6, Ctrl-C; states at 2 and 4) -> --continue from 4 (or, states gone, from 0): the steps past it
    are trained again, and steps_done = total_steps + steps_redone; a stop the user asked for costs no time."""
    from dataclasses import replace

    a1, a2 = _two_attempts(tmp_path)
    a1 = replace(a1, outcome="interrupted", exit_status=130)
    a2 = replace(a2, resume_from=None if resumed_at == 0 else a2.resume_from, start_step=resumed_at)
    s = summarize([a1, a2], status="success", reason="done", total_steps=10, final_config=None,
                  plan_config=None, lora_path=None)
    assert s["steps_redone"] == redone
    assert s["steps_done"] == 10 + redone and s["time_lost_s"] == 0.0
