"""State discovery on disk, per-attempt names, and the relaunch's scheduler settings."""

from __future__ import annotations

import json
import math

import pytest
from statefiles import write_state

from kohya_tuner.run.states import (AttemptOutput, attempt_config, continue_schedule, newest_resumable,
                                    publish_lora, schedule_note, settings_of, state_complete, states_on_disk)


def test_a_state_cut_short_is_not_resumable(tmp_path):
    whole = write_state(tmp_path / "a-step00000002-state", 2)
    assert state_complete(whole)
    for name, cut in (("model.safetensors", 5), ("optimizer.bin", 30), ("scheduler.bin", 0)):
        d = write_state(tmp_path / f"cut-{name}", 2)
        data = (d / name).read_bytes()
        (d / name).write_bytes(data[:cut])
        assert not state_complete(d), name
    no_rng = write_state(tmp_path / "no-rng", 2)
    (no_rng / "random_states_0.pkl").unlink()
    assert not state_complete(no_rng)
    bad_json = write_state(tmp_path / "bad-json", 2)
    (bad_json / "train_state.json").write_text("{\"current_step\":")
    assert not state_complete(bad_json)


def test_states_on_disk_belong_to_their_attempt_and_count_from_its_start(tmp_path):
    write_state(tmp_path / "lora-step00000003-state", 3)
    write_state(tmp_path / "lora-step00000005-state", 5)
    # Attempt 2 resumed at 5; its trainer counts from 0.
    write_state(tmp_path / "lora-attempt2-step00000002-state", 2)
    write_state(tmp_path / "lora-attempt2-000001-state", 3)  # an epoch state
    write_state(tmp_path / "lora-attempt12-step00000009-state", 9)  # another attempt's
    write_state(tmp_path / "someone-else-step00000009-state", 9)
    outs = [AttemptOutput(1, "lora", 0), AttemptOutput(2, "lora-attempt2", 5)]
    found = [(s.step, s.attempt) for s in states_on_disk(tmp_path, outs)]
    assert found == [(3, 1), (5, 1), (7, 2), (8, 2)]
    newest = newest_resumable(tmp_path, outs, total_steps=10)
    assert newest.step == 8 and newest.path.endswith("lora-attempt2-000001-state")
    # A final state (the whole run) leaves nothing to resume into.
    assert newest_resumable(tmp_path, outs, total_steps=8).step == 7


def _cosine(t, total, warm, cycles=0.5):
    """The cosine-with-warmup learning-rate factor at scheduler step t."""
    if t < warm:
        return t / max(1, warm)
    progress = (t - warm) / max(1, total - warm)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * cycles * 2.0 * progress)))


@pytest.mark.parametrize("total,start,warm", [(8, 5, 0), (8, 5, 100), (1000, 370, 100), (1000, 50, 100), (7, 1, 3)])
def test_a_resumed_cosine_stays_on_the_planned_curve(total, start, warm):
    cfg = {"lr_scheduler": "cosine", "lr_warmup_steps": warm, "max_train_steps": total}
    run = attempt_config(cfg, resume_from="/s", resume_step=start, total_steps=total, attempt=2)
    assert run["max_train_steps"] == total - start
    cycles = float(run["lr_scheduler_args"][-1].split("=", 1)[1])
    for t in range(start, total + 1):
        assert _cosine(t, run["max_train_steps"], warm, cycles) == pytest.approx(_cosine(t, total, warm), abs=1e-12)
    assert schedule_note(cfg) is None


def test_a_warmup_fraction_becomes_the_planned_step_count():
    out = continue_schedule({"lr_scheduler": "constant_with_warmup", "lr_warmup_steps": 0.1}, 1000, 400)
    assert out == {"lr_warmup_steps": 100}
    assert "compressed" in schedule_note({"lr_scheduler": "linear"})


def test_settings_of_an_attempt_take_the_rewritten_keys_from_the_plan():
    plan = {"output_name": "lora", "max_train_steps": 100, "lr_scheduler": "cosine", "network_dim": 16}
    ran = attempt_config({**plan, "gradient_checkpointing": True}, resume_from="/s", resume_step=40,
                         total_steps=100, attempt=3)
    assert settings_of(ran, plan) == {**plan, "gradient_checkpointing": True}


def test_publish_lora_never_writes_over_a_file(tmp_path):
    src = tmp_path / "lora-attempt2.safetensors"
    src.write_bytes(b"weights")
    path, note = publish_lora(str(src), "lora")
    assert path == str(tmp_path / "lora.safetensors") and note is None
    assert (tmp_path / "lora.safetensors").read_bytes() == b"weights"
    other = tmp_path / "mine-attempt1.safetensors"
    other.write_bytes(b"new")
    (tmp_path / "mine.safetensors").write_bytes(b"the user's")
    path, note = publish_lora(str(other), "mine")
    assert path == str(other) and "left as it is" in note
    assert (tmp_path / "mine.safetensors").read_bytes() == b"the user's"
    json.dumps(note)


def test_a_resumed_runs_lora_is_published_with_the_runs_step_count(tmp_path):
    import struct

    header = json.dumps({"__metadata__": {"ss_steps": "3", "ss_network_dim": "16"},
                         "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    src = tmp_path / "lora-attempt2.safetensors"
    src.write_bytes(struct.pack("<Q", len(header)) + header + b"\1\2\3\4\5\6\7\10")
    before = src.read_bytes()
    path, note = publish_lora(str(src), "lora", {"ss_steps": "8"})
    dest = tmp_path / "lora.safetensors"
    assert path == str(dest) and note is None and src.read_bytes() == before
    data = dest.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    head = json.loads(data[8:8 + n])
    assert head["__metadata__"] == {"ss_steps": "8", "ss_network_dim": "16"} and n % 8 == 0
    assert data[8 + n:] == b"\1\2\3\4\5\6\7\10"
    from kohya_tuner.run.states import _safetensors_whole

    assert _safetensors_whole(dest)
    # Publishing again finds the same tensors there and leaves it.
    assert publish_lora(str(src), "lora", {"ss_steps": "8"}) == (str(dest), None)


@pytest.mark.parametrize("total,done,warm", [(100, 40, 0), (100, 40, 10), (1000, 999, 100)])
def test_a_fresh_cosine_starts_where_the_planned_curve_is_and_ends_at_zero(total, done, warm):
    from kohya_tuner.run.states import fresh_schedule, fresh_schedule_note

    cfg = {"lr_scheduler": "cosine", "lr_warmup_steps": warm, "learning_rate": 1e-4, "unet_lr": 2e-4}
    out = fresh_schedule(cfg, total, done)
    # the fresh scheduler's first value (no warmup left) times the scaled rate is the planned one at `done`
    assert out["learning_rate"] == pytest.approx(1e-4 * _cosine(done, total, warm))
    assert out["unet_lr"] == pytest.approx(2e-4 * _cosine(done, total, warm))
    assert out.get("lr_warmup_steps", 0) == 0
    assert fresh_schedule_note(cfg) is None
    assert "starts over" in fresh_schedule_note({"lr_scheduler": "linear"})


def test_a_fresh_schedule_keeps_what_is_left_of_the_warmup():
    from kohya_tuner.run.states import fresh_schedule

    assert fresh_schedule({"lr_scheduler": "constant_with_warmup", "lr_warmup_steps": 0.1}, 1000, 40) == {
        "lr_warmup_steps": 60}
    assert fresh_schedule({"lr_scheduler": "constant"}, 100, 40) == {}


def test_states_before_a_continuation_from_weights_are_another_optimizers():
    from kohya_tuner.run.journal import AttemptRecord
    from kohya_tuner.run.states import lineage

    def rec(n, start, resume=None):
        return AttemptRecord(attempt=n, started="", config_file="c", log_file="l", reason="r", start_step=start,
                             resume_from=resume)

    runs = [rec(1, 0), rec(2, 5, "/o/s5"), rec(3, 7)]
    assert [a.attempt for a in lineage(runs)] == [3]
    assert [a.attempt for a in lineage(runs[:2])] == [1, 2]
