"""decide() and the bookkeeping around it, as pure functions: no process, no GPU."""

from __future__ import annotations

import re

import json
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import pytest

from kohya_tuner.families import get_family
from kohya_tuner.run.journal import Change, StateRecord
from kohya_tuner.run.policy import (AttemptFacts, Retry, RunState, Stop, decide, deficit_gib, keep_effective_batch,
                                    ram_changes, resume_unsafe)
from kohya_tuner.run.progress import Progress
from kohya_tuner.run.settings import probe_config
from kohya_tuner.run.states import attempt_config, ensure_resumable

SD15 = get_family("sd15")
FLUX = get_family("flux")


@dataclass
class FakeStep:
    move: str
    changes: list
    resume_safe: bool = True
    reason: str = "cheaper"
    saved_gib: float = 1.0
    note: str = ""


@dataclass
class FakeLadder:
    """Records how it was asked; offers moves from a script."""

    moves: list[FakeStep]
    calls: list[dict] = field(default_factory=list)

    def __call__(self, config, family, *, phase, deficit_gib, policy, dataset, tried, require_resume_safe,
                 only=None, **kw):
        self.calls.append(dict(phase=phase, deficit=deficit_gib, tried=set(tried), safe=require_resume_safe,
                               only=only, **kw))
        for m in self.moves:
            if m.move in tried or (only is not None and m.move not in only):
                continue
            if require_resume_safe and not m.resume_safe:
                continue
            if kw.get("never_keep") and {c[0] for c in m.changes} & set(kw.get("keep", ())):
                continue
            return m
        return None


def oom(phase="training", tried=2.0, free=0.5):
    return SimpleNamespace(outcome="oom", phase=phase, oom=SimpleNamespace(tried_gib=tried, free_gib=free),
                           error=None, advice=[])


def error(kind="python", message="FileNotFoundError: base.safetensors"):
    return SimpleNamespace(outcome="error", phase="model_load", oom=None, error={"kind": kind, "message": message},
                           advice=["check the path"])


PLAN = {"train_batch_size": 4, "network_dim": 16, "max_train_steps": 100, "save_every_n_steps": 10}


def state(tmp_path=None, **kw):
    base = dict(attempt=1, attempts_left=5, total_steps=100, plan_config=PLAN)
    base.update(kw)
    return RunState(**base)


def facts(**kw):
    base = dict(exit_status=1, end_step=37)
    base.update(kw)
    return AttemptFacts(**base)


def test_oom_takes_ladder_move_and_resumes_from_newest_state():
    ladder = FakeLadder([FakeStep("batch_half", [("train_batch_size", 4, 2)])])
    s = state(newest_state=StateRecord("/o/lora-step00000030-state", 30, 1))
    action = decide(oom(tried=2.0, free=0.5), PLAN, SD15, s, facts(), next_step=ladder)
    assert isinstance(action, Retry)
    assert action.resume_from == "/o/lora-step00000030-state" and action.start_step == 30
    assert action.note == "resumes from the state at step 30; steps 31-37 are redone"
    assert action.config["train_batch_size"] == 2
    # Effective batch kept: 4 x 1 before, 2 x 2 after; the step count stays the plan's.
    assert action.config["gradient_accumulation_steps"] == 2
    assert action.config["max_train_steps"] == 100
    assert {c.key for c in action.changes} == {"train_batch_size", "gradient_accumulation_steps"}
    assert ladder.calls[0]["deficit"] == pytest.approx(1.5)
    assert ladder.calls[0]["phase"] == "training" and ladder.calls[0]["safe"] is True
    assert "out of memory while training after step 37, 1.50 GiB short" in action.reason


def test_resume_safe_move_preferred_when_a_state_exists():
    ladder = FakeLadder([FakeStep("rank_half", [("network_dim", 16, 8)], resume_safe=False),
                         FakeStep("checkpointing", [("gradient_checkpointing", None, True)])])
    s = state(newest_state=StateRecord("/o/s", 30, 1))
    action = decide(oom(), PLAN, SD15, s, facts(), next_step=ladder)
    assert action.move == "checkpointing" and action.resume_from == "/o/s"


def test_unsafe_move_restarts_and_says_so():
    ladder = FakeLadder([FakeStep("rank_half", [("network_dim", 16, 8)], resume_safe=False)])
    s = state(newest_state=StateRecord("/o/s", 30, 1))
    action = decide(oom(), PLAN, SD15, s, facts(), next_step=ladder)
    assert action.resume_from is None and action.start_step == 0
    assert "restarts from step 0" in action.note and "network_dim" in action.note


def test_ladder_claiming_safety_is_overruled_for_pinned_keys():
    # A state cannot load into a network of another rank, whatever a move claims.
    ladder = FakeLadder([FakeStep("rank_half", [("network_dim", 16, 8)], resume_safe=True)])
    s = state(newest_state=StateRecord("/o/s", 30, 1))
    action = decide(oom(), PLAN, SD15, s, facts(), next_step=ladder)
    assert action.resume_from is None


def test_no_state_yet_restarts_from_zero():
    ladder = FakeLadder([FakeStep("checkpointing", [("gradient_checkpointing", None, True)])])
    action = decide(oom(phase="model_load"), PLAN, SD15, state(), facts(end_step=0), next_step=ladder)
    assert action.resume_from is None and "no saved state" in action.note
    assert ladder.calls[0]["safe"] is False  # nothing to protect, so any move may be taken


def test_sampling_oom_changes_only_sampling():
    """The sampling phase's rule (ladder data): smaller previews first, sampling off next, a
    training setting only after both."""
    from kohya_tuner.memory.setup import SAMPLE_SIZE_KEY

    cfg = dict(PLAN, sample_every_n_steps=20, sample_prompts="p.txt", sample_at_first=True)
    ladder = FakeLadder([FakeStep("batch_half", [("train_batch_size", 4, 2)]),
                         FakeStep("sample_less", [("sample_every_n_steps", 20, None), ("sample_at_first", True, None)]),
                         FakeStep("sample_smaller", [(SAMPLE_SIZE_KEY, "1024x1024", "512x512")])])
    s = state(newest_state=StateRecord("/o/s", 20, 1))
    action = decide(oom(phase="sampling"), cfg, SD15, s, facts(end_step=20), next_step=ladder)
    assert action.move == "sample_smaller" and action.sample_size == "512x512"
    assert [(c.key, c.old, c.new) for c in action.changes] == [("previews (--w/--h)", "1024x1024", "512x512")]
    assert SAMPLE_SIZE_KEY not in action.config and action.config == {k: v for k, v in cfg.items()}
    assert action.resume_from == "/o/s"
    assert [c["only"] for c in ladder.calls] == [frozenset({"sample_smaller"})]
    action = decide(oom(phase="sampling"), cfg, SD15, replace(s, tried=frozenset({"sample_smaller"})),
                    facts(end_step=20), next_step=ladder)
    assert {c.key for c in action.changes} == {"sample_every_n_steps", "sample_at_first"}
    assert action.config["train_batch_size"] == 4 and action.resume_from == "/o/s" and action.sample_size is None
    action = decide(oom(phase="sampling"), cfg, SD15, replace(s, tried=frozenset({"sample_smaller", "sample_less"})),
                    facts(end_step=20), next_step=ladder)
    assert action.move == "batch_half"


def test_sampling_oom_on_the_real_ladder_draws_smaller_previews_then_none(tmp_path):
    """With the run's prompt file at 1024 px on SD 1.5: the real ladder's first answer is
    previews at most 768 or 512 px; once that was tried, sampling off."""
    from kohya_tuner import presets

    prompts = tmp_path / "p.txt"
    prompts.write_text("a cat --w 1024 --h 1024\n")
    plan = presets.compose("sd15", "character", 8)
    cfg = {**plan.config, "sample_every_n_steps": 20, "sample_prompts": str(prompts)}
    s = state(newest_state=StateRecord("/o/s", 20, 1), sample_size="1024x1024")
    action = decide(oom(phase="sampling", tried=3.0, free=0.2), cfg, SD15, s, facts(end_step=20))
    assert action.move == "sample_smaller" and action.sample_size in ("768x768", "512x512")
    assert action.config.get("sample_every_n_steps") == 20 and action.resume_from == "/o/s"
    action = decide(oom(phase="sampling", tried=3.0, free=0.2), cfg, SD15,
                    replace(s, tried=frozenset({"sample_smaller"})), facts(end_step=20))
    assert action.move == "sample_less" and "sample_every_n_steps" not in action.config
    # A prompt file kohya-tuner cannot read is not resized: sampling goes off.
    action = decide(oom(phase="sampling", tried=3.0, free=0.2), cfg, SD15, replace(s, sample_size=None),
                    facts(end_step=20))
    assert action.move == "sample_less"


def test_non_oom_failure_is_never_retried():
    ladder = FakeLadder([FakeStep("batch_half", [("train_batch_size", 4, 2)])])
    action = decide(error(), PLAN, SD15, state(), facts(), next_step=ladder)
    assert isinstance(action, Stop) and action.status == "failed"
    assert "not retried" in action.reason and "base.safetensors" in action.reason
    assert action.advice == ("check the path",)
    assert ladder.calls == []


def test_floor_reached_stops_with_clear_reason():
    action = decide(oom(), PLAN, SD15, state(), facts(), next_step=FakeLadder([]))
    assert isinstance(action, Stop) and "floor" in action.reason


def test_attempts_exhausted_stops():
    ladder = FakeLadder([FakeStep("batch_half", [("train_batch_size", 4, 2)])])
    action = decide(oom(), PLAN, SD15, state(attempts_left=0), facts(), next_step=ladder)
    assert isinstance(action, Stop) and "--max-attempts" in action.reason


def test_tried_moves_are_passed_on():
    ladder = FakeLadder([FakeStep("batch_half", [("train_batch_size", 4, 2)]),
                         FakeStep("checkpointing", [("gradient_checkpointing", None, True)])])
    action = decide(oom(), PLAN, SD15, state(tried=frozenset({"batch_half"})), facts(), next_step=ladder)
    assert action.move == "checkpointing"


def test_success_needs_exit_zero_and_final_model():
    ok = decide(SimpleNamespace(outcome="success"), PLAN, SD15, state(),
                facts(exit_status=0, final_model="/o/lora.safetensors"), next_step=FakeLadder([]))
    assert isinstance(ok, Stop) and ok.status == "success"
    no_file = decide(SimpleNamespace(outcome="success", error=None, advice=[]), PLAN, SD15, state(),
                     facts(exit_status=0, final_model=None), next_step=FakeLadder([]))
    assert isinstance(no_file, Stop) and no_file.status == "failed" and "no final model" in no_file.reason


def test_interrupt_and_hang_stop():
    a = decide(oom(), PLAN, SD15, state(), facts(interrupted=True), next_step=FakeLadder([]))
    assert isinstance(a, Stop) and a.status == "interrupted"
    h = decide(SimpleNamespace(outcome="incomplete"), PLAN, SD15, state(), facts(hung=True, hang_minutes=0.5),
               next_step=FakeLadder([]))
    assert isinstance(h, Stop) and "nothing for 0.5 minutes" in h.reason
    # The advice offers what --continue will change only where it changes something.
    assert "max_data_loader_n_workers = 0" in h.advice[0]
    in_process = {**PLAN, "max_data_loader_n_workers": 0}
    h0 = decide(SimpleNamespace(outcome="incomplete"), in_process, SD15, replace(state(), processes=2),
                facts(hung=True, hang_minutes=0.5), next_step=FakeLadder([]))
    assert "already runs in the training process" in h0.advice[0] and "several ranks" in h0.advice[0]
    assert "max_data_loader_n_workers = 0" not in h0.advice[0]


def test_host_ram_kill_takes_ram_moves_not_vram_moves():
    ladder = FakeLadder([FakeStep("batch_half", [("train_batch_size", 4, 2)])])
    diag = SimpleNamespace(outcome="error", phase="model_load", oom=None, error={"kind": "killed"}, advice=[])
    cfg = dict(PLAN, max_data_loader_n_workers=8, persistent_data_loader_workers=True)
    action = decide(diag, cfg, SD15, state(), facts(killed=True, end_step=0), next_step=ladder)
    assert isinstance(action, Retry) and action.move == "ram_workers"
    assert action.config["max_data_loader_n_workers"] == 0
    assert "persistent_data_loader_workers" not in action.config
    assert ladder.calls == []


def test_ram_moves_run_out():
    cfg = dict(PLAN, max_data_loader_n_workers=0, lowram=True)
    assert ram_changes(cfg, SD15, frozenset()) is None
    cfg2 = dict(PLAN, max_data_loader_n_workers=0, cache_latents=True)
    name, changes, _ = ram_changes(cfg2, SD15, frozenset({"ram_workers"}))
    assert name == "ram_disk_caches" and changes == [("cache_latents_to_disk", None, True)]


def test_probe_success_moves_on_to_the_full_run():
    action = decide(SimpleNamespace(outcome="success"), PLAN, SD15, state(probe=True, total_steps=20),
                    facts(exit_status=0, final_model="/o/probe/probe.safetensors"), next_step=FakeLadder([]))
    assert isinstance(action, Retry) and action.resume_from is None and "probe" in action.reason


def test_probe_oom_never_resumes_probe_states():
    ladder = FakeLadder([FakeStep("batch_half", [("train_batch_size", 4, 2)])])
    s = state(probe=True, newest_state=StateRecord("/o/s", 30, 1))
    action = decide(oom(), PLAN, SD15, s, facts(), next_step=ladder)
    assert action.resume_from is None


# ---- helpers -------------------------------------------------------------------------------


def test_attempt_config_runs_a_resume_as_a_run_of_the_steps_left():
    cfg = {"max_train_steps": 100, "resume": "/stale", "initial_step": 3, "skip_until_initial_step": True,
           "output_name": "lora"}
    fresh = attempt_config(cfg, resume_from=None, resume_step=0, total_steps=100, attempt=1)
    assert "resume" not in fresh and "initial_step" not in fresh and "skip_until_initial_step" not in fresh
    assert fresh["max_train_steps"] == 100 and fresh["output_name"] == "lora"
    resumed = attempt_config(cfg, resume_from="/o/s", resume_step=30, total_steps=100, attempt=2)
    assert resumed["resume"] == "/o/s" and resumed["initial_step"] == 0
    assert "skip_until_initial_step" not in resumed
    assert resumed["max_train_steps"] == 70 and resumed["output_name"] == "lora-attempt2"
    with pytest.raises(ValueError):
        attempt_config(cfg, resume_from="/o/s", resume_step=100, total_steps=100, attempt=3)


def test_keep_effective_batch_cases():
    cfg, why = keep_effective_batch({"train_batch_size": 2}, 4)
    assert cfg["gradient_accumulation_steps"] == 2 and why is None
    cfg, why = keep_effective_batch({"train_batch_size": 3}, 4)
    assert "gradient_accumulation_steps" not in cfg and "not a multiple" in why
    cfg, why = keep_effective_batch({"train_batch_size": 1, "fused_backward_pass": True}, 2)
    assert "fused_backward_pass" in why


def test_resume_unsafe_keys():
    assert resume_unsafe([Change("gradient_checkpointing", None, True), Change("train_batch_size", 2, 1)]) == []
    assert resume_unsafe([Change("network_dim", 16, 8)]) == ["network_dim"]
    assert resume_unsafe([("mixed_precision", "bf16", "fp16")]) == ["mixed_precision"]
    assert resume_unsafe([("mixed_precision", "fp16", "bf16")]) == []


def test_ensure_resumable_forces_states_and_scales_cadence():
    out = ensure_resumable({"save_state": False}, 3000)
    assert out["save_state"] is True
    assert 100 <= out["save_every_n_steps"] <= 500
    assert out["save_last_n_steps_state"] == 2 * out["save_every_n_steps"]
    kept = ensure_resumable({"save_every_n_steps": 50}, 3000)
    assert kept["save_every_n_steps"] == 50


def test_deficit_from_figures():
    assert deficit_gib(SimpleNamespace(tried_gib=2.0, free_gib=0.25)) == pytest.approx(1.75)
    assert deficit_gib({"tried_gib": 1.0, "free_gib": None}) == pytest.approx(1.0)
    assert deficit_gib(None) is None


def test_probe_config_is_short_and_stateless(tmp_path):
    cfg = probe_config(dict(PLAN, save_state=True, resume="/x", output_dir="/o/output"), 20, tmp_path)
    assert cfg["max_train_steps"] == 20 and "save_state" not in cfg and "resume" not in cfg
    assert cfg["output_dir"] == str(tmp_path / "probe")


def test_progress_tracks_absolute_steps_across_a_resume():
    p = Progress(start_step=30, total_steps=100, attempt=2)
    p.on_progress(5, 70, 0.2, 3.0)
    assert p.step == 35
    assert p.eta_s == pytest.approx(65 / 3.0)
    # A resumed attempt counts from 0: its state at its own step 10 is absolute step 40,
    # ahead of a bar that lagged at 35.
    rec = p.on_saved("state", "/o/lora-attempt2-step00000010-state")
    assert rec.step == 40
    # A number behind the bar does not pull the count back.
    p.on_progress(20, 70, 0.2, 3.0)
    rec = p.on_saved("state", "/o/lora-attempt2-step00000015-state")
    assert rec.step == 50
    p.on_saved("checkpoint", "/o/lora-step00000050.safetensors")
    assert p.final_model is None
    p.on_saved("checkpoint", "/o/lora.safetensors")
    assert p.final_model == "/o/lora.safetensors"
    assert [pt[1] for pt in p.losses] == [35, 50]


# ---- --continue ------------------------------------------------------------------------------


def _settings(tmp_path):
    from kohya_tuner.run.settings import RunSettings

    return RunSettings(out_dir=tmp_path, family=SD15, script=tmp_path / "train_network.py", dataset_file=None,
                       plan_config=dict(PLAN, output_dir=str(tmp_path / "output"), output_name="lora", save_state=True),
                       total_steps=100, python="python")


def _state_dir(tmp_path, step, attempt=1, start=0):
    from statefiles import write_state

    name = "lora" if attempt == 1 else f"lora-attempt{attempt}"
    return write_state(tmp_path / "output" / f"{name}-step{step - start:08d}-state", step - start)


def _record(tmp_path, outcome, states, **kw):
    from kohya_tuner.run.journal import AttemptRecord

    cfg = tmp_path / "attempt-1.config.toml"
    cfg.write_text('[training]\ntrain_batch_size = 4\nnetwork_dim = 16\nmax_train_steps = 100\n'
                   'resume = "/old"\n', encoding="utf-8")
    base = dict(attempt=1, started="t", config_file=str(cfg), log_file="l", reason="plan", outcome=outcome,
                states=states, end_step=35, exit_status=1)
    base.update(kw)
    return AttemptRecord(**base)


def test_continue_without_attempts_starts_the_plan(tmp_path):
    from kohya_tuner.run.continuation import continuation

    action = continuation([], _settings(tmp_path))
    assert isinstance(action, Retry) and action.resume_from is None and action.config["save_state"] is True


def test_continue_after_interruption_resumes_newest_state_with_same_settings(tmp_path):
    from kohya_tuner.run.continuation import continuation

    d = _state_dir(tmp_path, 30)
    rec = _record(tmp_path, "interrupted", [StateRecord(str(d), 30, 1)])
    action = continuation([rec], _settings(tmp_path))
    assert action.resume_from == str(d) and action.start_step == 30 and not action.changes
    assert action.config["train_batch_size"] == 4 and "resume" not in action.config


def test_continue_finds_a_state_the_journal_never_saw(tmp_path):
    from kohya_tuner.run.continuation import continuation

    known = _state_dir(tmp_path, 10)
    newer = _state_dir(tmp_path, 30)  # the journal recorded it under no state line (quiet logs)
    rec = _record(tmp_path, "interrupted", [StateRecord(str(known), 10, 1)])
    action = continuation([rec], _settings(tmp_path))
    assert action.resume_from == str(newer) and action.start_step == 30


def test_continue_finds_the_states_of_an_attempt_the_journal_never_recorded(tmp_path):
    from kohya_tuner.run.continuation import continuation

    _state_dir(tmp_path, 10)
    rec = _record(tmp_path, "oom", [], end_step=12, phase="training")
    # Attempt 2 resumed from step 10 (so it trains the 90 left) and saved at its own step 25;
    # then kohya-tuner itself was killed, so the journal ends at attempt 1.
    (tmp_path / "attempt-2.config.toml").write_text(
        '[training]\nmax_train_steps = 90\noutput_name = "lora-attempt2"\nresume = "x"\ninitial_step = 0\n',
        encoding="utf-8")
    orphan = _state_dir(tmp_path, 35, attempt=2, start=10)
    action = continuation([rec], _settings(tmp_path))
    assert action.resume_from == str(orphan) and action.start_step == 35


def test_continue_after_oom_makes_the_decision_the_loop_would_have(tmp_path):
    from kohya_tuner.run.continuation import continuation

    d = _state_dir(tmp_path, 30)
    rec = _record(tmp_path, "oom", [StateRecord(str(d), 30, 1)], phase="training",
                  oom={"tried_gib": 2.0, "free_gib": 0.5})
    ladder = FakeLadder([FakeStep("checkpointing", [("gradient_checkpointing", None, True)])])
    action = continuation([rec], _settings(tmp_path), next_step=ladder)
    assert action.move == "checkpointing" and action.resume_from == str(d)
    assert action.reason.startswith("continued: out of memory")


def test_a_continued_run_keeps_a_dataset_file_a_move_wrote(tmp_path):
    from kohya_tuner.run.loop import Supervisor

    (tmp_path / "attempt-2.dataset.toml").write_text('[[datasets]]\nbatch_size = 1\n[[datasets.subsets]]\n'
                                                     'image_dir = "a"\n', encoding="utf-8")
    (tmp_path / "attempt-5.dataset.toml").write_text('[[datasets]]\nbatch_size = 2\n[[datasets.subsets]]\n'
                                                     'image_dir = "a"\n', encoding="utf-8")
    sup = Supervisor(_settings(tmp_path))
    assert sup.dataset_file == tmp_path / "attempt-5.dataset.toml"
    assert sup.dataset["datasets"][0]["batch_size"] == 2


def test_a_move_to_an_8bit_optimizer_without_bitsandbytes_becomes_adafactor(tmp_path):
    from kohya_tuner.run.loop import Supervisor

    sup = Supervisor(_settings(tmp_path))
    sup._modules = {"bitsandbytes": None}  # what the probe of the trainer's Python found
    move = Retry(config=dict(PLAN, optimizer_type="AdamW8bit"), resume_from=None,
                 changes=[Change("optimizer_type", "AdamW", "AdamW8bit")], reason="out of memory", note="n")
    fitted = sup._fit_environment(move)
    assert fitted.config["optimizer_type"] == "Adafactor" and "bitsandbytes is not installed" in fitted.note
    assert [c for c in fitted.changes if c.key == "optimizer_type"] == [Change("optimizer_type", "AdamW", "Adafactor")]
    sup._modules = {"bitsandbytes": "0.45.0"}
    assert sup._fit_environment(move) == move


def test_the_ladder_hears_the_cpu_the_users_keys_and_a_repeated_phase():
    from kohya_tuner import ladder as real_ladder

    ladder = FakeLadder([FakeStep("batch_half", [("train_batch_size", 4, 2)])])
    s = state(newest_state=StateRecord("/o/lora-step00000030-state", 30, 1), cpu=True,
              user_keys=frozenset({"mixed_precision"}), last_move_phase="training")
    decide(oom(), PLAN, SD15, s, facts(), next_step=ladder)
    call = ladder.calls[0]
    assert call["cpu"] is True and call["keep"] == {"mixed_precision"} and call["one_at_a_time"] is True
    decide(oom(phase="model_load"), PLAN, SD15, s, facts(), next_step=ladder)
    assert ladder.calls[-1]["one_at_a_time"] is False  # another phase: the estimate was not proven wrong there
    # With the real ladder the note of a repeated phase says why the move comes alone.
    cfg = {"network_module": "networks.lora", "network_dim": 32, "network_alpha": 16.0, "resolution": "768",
           "train_batch_size": 2, "mixed_precision": "no", "max_train_steps": 100, "save_every_n_steps": 10}
    action = decide(oom(tried=60.0, free=0.5), cfg, SD15, s, facts(), next_step=real_ladder.next_step)
    assert isinstance(action, Retry) and "+" not in action.move and action.move != "mixed_precision"
    assert "the estimate said the last move would be enough, and it ran out of memory while training again" in action.note


def test_a_restart_comes_before_a_change_to_a_key_the_user_set():
    from kohya_tuner import ladder as real_ladder

    cfg = {"network_module": "networks.lora", "network_dim": 16, "network_alpha": 8.0, "resolution": "64,64",
           "train_batch_size": 1, "gradient_accumulation_steps": 4, "mixed_precision": "no", "sdpa": True,
           "cache_latents": True, "gradient_checkpointing": True, "optimizer_type": "AdamW",
           "max_train_steps": 3, "save_every_n_steps": 1}
    s = state(newest_state=StateRecord("/o/lora-step00000002-state", 2, 2), cpu=True, total_steps=3,
              user_keys=frozenset({"mixed_precision", "resolution"}), plan_config=cfg)
    action = decide(oom(tried=0.04, free=0.02), cfg, SD15, s, facts(end_step=2), next_step=real_ladder.next_step)
    assert isinstance(action, Retry)
    assert "mixed_precision" not in {c.key for c in action.changes}
    # Without the user's claim on it, the resume-safe precision move wins over a restart.
    mine = decide(oom(tried=0.04, free=0.02), cfg, SD15, replace(s, user_keys=frozenset()), facts(end_step=2),
                  next_step=real_ladder.next_step)
    assert "mixed_precision" in {c.key for c in mine.changes}


def test_a_shortfall_within_the_estimates_error_keeps_the_saved_state_instead_of_restarting():
    # The resume-safe move that covers it all is the user's precision; the one that leaves their keys
    # alone saves 0.1 GiB of a 0.2 GiB shortfall; the rest is a rank cut, which restarts.
    moves = [FakeStep("rank_half", [("network_dim", 16, 8)], resume_safe=False, saved_gib=0.5),
             FakeStep("precision", [("mixed_precision", "no", "bf16")], saved_gib=0.5),
             FakeStep("batch_to_accumulation", [("train_batch_size", 4, 2)], saved_gib=0.1)]
    s = state(newest_state=StateRecord("/o/lora-step00000030-state", 30, 1),
              user_keys=frozenset({"mixed_precision"}))
    near = decide(oom(tried=0.3, free=0.1), PLAN, SD15, s, facts(end_step=30), next_step=FakeLadder(moves))
    assert near.move == "batch_to_accumulation" and near.resume_from == "/o/lora-step00000030-state"
    assert "keeps the saved state" in near.note and "within the estimate's error" in near.note
    # Short by more than the estimate's error: the move that covers it, though it restarts.
    far = decide(oom(tried=2.0, free=0.5), PLAN, SD15, s, facts(end_step=30), next_step=FakeLadder(moves))
    assert far.move == "rank_half" and far.resume_from is None
    # Without a figure for the shortfall nothing can be judged near: the covering move.
    bare = SimpleNamespace(outcome="oom", phase="training", oom=None, error=None, advice=[])
    assert decide(bare, PLAN, SD15, s, facts(end_step=30), next_step=FakeLadder(moves)).move == "rank_half"


def test_a_move_with_its_own_note_reads_as_words_with_or_without_a_second_clause():
    s = state(newest_state=StateRecord("/o/lora-step00000030-state", 30, 1),
              user_keys=frozenset({"mixed_precision"}))
    own = FakeStep("precision", [("mixed_precision", "no", "bf16")],
                   note="changes mixed_precision, which you set yourself: no other move is left for this phase")
    for tried, free in ((60.0, 0.5), (0.3, 0.1), (None, None)):
        diag = oom(tried=tried, free=free) if tried else SimpleNamespace(outcome="oom", phase="training", oom=None,
                                                                         error=None, advice=[])
        action = decide(diag, PLAN, SD15, s, facts(end_step=30), next_step=FakeLadder([own]))
        assert isinstance(action, Retry) and own.note in action.note
        assert not re.search(r"\bNone\b", action.note), action.note


# ---- continuing through moves the saved state cannot follow ----------------------------------


LORA_PLAN = {**PLAN, "network_module": "networks.lora", "optimizer_type": "AdamW"}


def test_an_optimizer_move_continues_from_the_saved_lora_weights():
    ladder = FakeLadder([FakeStep("optimizer_adafactor", [("optimizer_type", "AdamW", "Adafactor"),
                                                          ("optimizer_args", None, ["relative_step=False"])],
                                  resume_safe=False)])
    s = state(plan_config=LORA_PLAN, newest_state=StateRecord("/o/lora-step00000037-state", 37, 1))
    action = decide(oom(), LORA_PLAN, SD15, s, facts(), next_step=ladder)
    assert action.resume_from is None and action.weights_from == "/o/lora-step00000037-state/model.safetensors"
    assert action.start_step == 37
    assert "continues from the LoRA weights of the state at step 37 with a fresh optimizer" in action.note
    assert "redone" not in action.note
    run = attempt_config(action.config, resume_from=None, weights_from=action.weights_from, resume_step=37,
                         total_steps=100, attempt=2)
    assert run["network_weights"] == action.weights_from and run["max_train_steps"] == 63
    assert "resume" not in run and "initial_step" not in run


def test_a_rank_move_still_restarts_and_a_full_finetune_has_no_weights_to_carry():
    rank = FakeLadder([FakeStep("rank_half", [("network_dim", 16, 8)], resume_safe=False)])
    s = state(plan_config=LORA_PLAN, newest_state=StateRecord("/o/s", 30, 1))
    action = decide(oom(), LORA_PLAN, SD15, s, facts(), next_step=rank)
    assert action.weights_from is None and action.start_step == 0 and "restarts from step 0" in action.note
    opt = FakeLadder([FakeStep("optimizer_8bit", [("optimizer_type", "AdamW", "AdamW8bit")], resume_safe=False)])
    action = decide(oom(), PLAN, SD15, state(newest_state=StateRecord("/o/s", 30, 1)), facts(), next_step=opt)
    assert action.weights_from is None and action.start_step == 0
    # several processes save the weights under DDP's names, which network_weights does not load
    s = state(plan_config=LORA_PLAN, newest_state=StateRecord("/o/s", 30, 1), processes=2)
    action = decide(oom(), LORA_PLAN, SD15, s, facts(), next_step=opt)
    assert action.weights_from is None and action.start_step == 0


def test_steps_redone_count_a_continuation_from_weights_as_kept():
    from kohya_tuner.run.journal import AttemptRecord, summarize

    def rec(n, start, end, outcome, resume=None):
        return AttemptRecord(attempt=n, started="", config_file="c", log_file="l", reason="r", start_step=start,
                             end_step=end, outcome=outcome, resume_from=resume)

    # attempt 2 resumed the OOM state at 5, attempt 3 continued from the weights at 7
    attempts = [rec(1, 0, 5, "oom"), rec(2, 5, 7, "oom", "/o/s5"), rec(3, 7, 10, "success")]
    summary = summarize(attempts, status="success", reason="", total_steps=10, final_config=None,
                        plan_config=None, lora_path=None)
    assert summary["steps_done"] == 10 and summary["steps_redone"] == 0
    # a restart from step 0 still throws everything before it away
    attempts = [rec(1, 0, 5, "oom"), rec(2, 0, 10, "success")]
    assert summarize(attempts, status="success", reason="", total_steps=10, final_config=None, plan_config=None,
                     lora_path=None)["steps_redone"] == 5


def test_without_a_state_of_its_own_a_continuation_from_weights_continues_from_them_again():
    ladder = FakeLadder([FakeStep("checkpointing", [("gradient_checkpointing", None, True)])])
    weights = StateRecord("/o/lora-attempt2-step00000001-state/model.safetensors", 40, 2)
    s = state(plan_config=LORA_PLAN, newest_state=None, weights=weights)
    action = decide(oom(), LORA_PLAN, SD15, s, facts(end_step=40), next_step=ladder)
    assert action.weights_from == weights.path and action.start_step == 40 and action.resume_from is None
    assert "continues from them again" in action.note and "redone" not in action.note
    # a rank move reshapes the network: those weights cannot be loaded
    rank = FakeLadder([FakeStep("rank_half", [("network_dim", 16, 8)], resume_safe=False)])
    action = decide(oom(), LORA_PLAN, SD15, s, facts(end_step=40), next_step=rank)
    assert action.weights_from is None and action.start_step == 0


def test_the_same_phase_again_asks_the_ladder_for_a_margin_over_the_shortfall():
    from kohya_tuner.run.policy import REPEAT_MARGIN_GIB

    ladder = FakeLadder([FakeStep("checkpointing", [("gradient_checkpointing", None, True)])])
    s = state(newest_state=StateRecord("/o/s", 30, 1), last_move_phase="training")
    action = decide(oom(tried=0.06, free=0.0), PLAN, SD15, s, facts(), next_step=ladder)
    assert ladder.calls[0]["deficit"] == pytest.approx(0.06 + REPEAT_MARGIN_GIB)
    assert "0.06 GiB short" in action.reason and f"{REPEAT_MARGIN_GIB:g} GiB more" in action.note
    # a first OOM of a phase asks for the shortfall itself
    ladder = FakeLadder([FakeStep("checkpointing", [("gradient_checkpointing", None, True)])])
    decide(oom(tried=0.06, free=0.0), PLAN, SD15, state(newest_state=StateRecord("/o/s", 30, 1)), facts(),
           next_step=ladder)
    assert ladder.calls[0]["deficit"] == pytest.approx(0.06)


# ---- a loss that became NaN -------------------------------------------------------------------

SDXL = get_family("sdxl")


@pytest.mark.parametrize("exit_status,final", [(0, "/o/lora.safetensors"), (1, None), (-2, None)])
def test_a_nan_loss_stops_the_run_whatever_the_exit(exit_status, final):
    """Stopped at the NaN (SIGINT) or, were it to get there, finished with a model file: never a
    success, never retried, and continuing is not offered."""
    state = RunState(attempt=1, attempts_left=5, total_steps=100, plan_config={})
    facts = AttemptFacts(exit_status=exit_status, end_step=7, final_model=final, nan_loss_step=7)
    action = decide(SimpleNamespace(outcome="error", phase="training", oom=None, error=None, advice=[]),
                    {"mixed_precision": "bf16", "learning_rate": 1e-4}, SD15, state, facts)
    assert isinstance(action, Stop) and action.status == "failed" and not action.can_continue
    assert "became NaN at step 7" in action.reason


@pytest.mark.parametrize("family,config,named,not_named", [
    (SDXL, {"mixed_precision": "fp16", "learning_rate": 1e-4}, ["no_half_vae", "mixed_precision=bf16",
                                                               "learning_rate=5e-05"], []),
    (SDXL, {"mixed_precision": "fp16", "no_half_vae": True, "learning_rate": 1e-4, "full_fp16": True},
     ["mixed_precision=bf16", "full_fp16"], ["no_half_vae=true"]),
    (SD15, {"mixed_precision": "bf16", "learning_rate": 2e-4, "unet_lr": 2e-4}, ["learning_rate=0.0001",
                                                                                "unet_lr=0.0001"],
     ["no_half_vae", "bf16 where"]),
    (FLUX, {"mixed_precision": "fp16", "learning_rate": 1e-4}, ["mixed_precision=bf16"], ["no_half_vae"]),
    (FLUX, {"mixed_precision": "bf16", "learning_rate": 1.0, "optimizer_type": "Prodigy"}, ["d_coef"],
     ["learning_rate=0.5"]),
    (SD15, {"mixed_precision": "bf16", "learning_rate": 1e-4, "max_grad_norm": 0}, ["max_grad_norm=1.0"], []),
])
def test_nan_advice_names_what_applies_to_this_config(family, config, named, not_named):
    from kohya_tuner.run.policy import nan_advice

    advice = nan_advice(config, family)
    text = " ".join(advice)
    for word in named:
        assert word in text, (word, advice)
    for word in not_named:
        assert word not in text, (word, advice)
    assert "new run" in advice[-1]
    if family is SDXL and not config.get("no_half_vae"):
        assert "VAE" in advice[0], "the most likely cause comes first"


@pytest.mark.parametrize("kind, words", [("other", "failed with an error, not"), ("xformers", "an error (xformers), not"),
                                         ("cuda_error", "an error (cuda_error), not")])
def test_a_failure_is_named_in_words_that_read(kind, words):
    action = decide(error(kind=kind), PLAN, SD15, state(), facts(), next_step=FakeLadder([]))
    assert isinstance(action, Stop) and words in action.reason and " a other " not in action.reason


@pytest.mark.parametrize("phase, step, words", [
    ("first_step", 0, "out of memory during the first step, 1.50 GiB short"),
    ("first_step", 0, "out of memory during the first step, and"),
    ("model_load", 0, "out of memory while loading the model before the first step"),
    ("training", 12, "out of memory while training after step 12"),
])
def test_the_step_is_said_once(phase, step, words):
    ladder = FakeLadder([FakeStep("batch_half", [("train_batch_size", 4, 2)])]) if "and" not in words else FakeLadder([])
    action = decide(oom(phase=phase), PLAN, SD15, state(), facts(end_step=step), next_step=ladder)
    assert words in action.reason, action.reason
    assert "first step before the first step" not in action.reason and "  " not in action.reason


def test_the_logs_advice_leaves_out_what_the_config_already_does():
    from kohya_tuner.run.policy import advice_for

    advice = ["Set the environment variable PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before launching.",
              "The largest bucket can come late: lower `max_bucket_reso` (or `resolution`).",
              "Then save activation memory: `gradient_checkpointing = true` and `train_batch_size = 1`.",
              "Make the optimizer state smaller: `optimizer_type = \"AdamW8bit\"`."]
    done = {"gradient_checkpointing": True, "train_batch_size": 1, "enable_bucket": False,
            "optimizer_type": "AdamW8bit"}
    assert advice_for(advice, done) == advice[:1]
    half = {"gradient_checkpointing": True, "train_batch_size": 2, "enable_bucket": True, "optimizer_type": "AdamW"}
    assert advice_for(advice, half) == advice
    # A value of another type is not the same setting: 1 is not true.
    assert advice_for(advice[2:3], {"gradient_checkpointing": 1, "train_batch_size": 1}) == advice[2:3]


def test_the_floor_advice_fits_the_phase_that_ran_out():
    from kohya_tuner.run.policy import _FLOOR_ADVICE

    for phase, words in (("cache_text_encoder", "text-encoder file"), ("model_load", "model files"),
                         ("training", "lower resolution")):
        empty = FakeLadder([])
        s = state(newest_state=None)
        diag = SimpleNamespace(outcome="oom", phase=phase, oom=None, error=None, advice=[])
        stop = decide(diag, PLAN, SD15, s, facts(end_step=0), next_step=empty)
        assert isinstance(stop, Stop) and words in stop.advice[0], (phase, stop.advice)
    assert "resolution" not in _FLOOR_ADVICE["cache_text_encoder"]
