"""`kohya-tuner run --continue OUT`: where a journaled run picks up."""

from __future__ import annotations

from typing import Any, Callable

from kohya_tuner.run import journal as jr
from kohya_tuner.run.journal import AttemptRecord
from kohya_tuner.run.policy import AttemptFacts, Retry, RunState, Stop, decide
from kohya_tuner.run.settings import RunSettings, read_config_file
from kohya_tuner.run.states import ensure_resumable, lineage, unjournaled_state


def continuation(attempts: list[AttemptRecord], settings: RunSettings, *,
                 next_step: Callable[..., Any] | None = None) -> Retry | Stop:
    """How `run --continue` picks up: after an OOM, the decision the loop would have made;
    after an interruption, a hang or an error, the same settings from the newest state."""
    if not attempts:
        return Retry(config=ensure_resumable(settings.plan_config, settings.total_steps), resume_from=None,
                     changes=[], reason="the fitted plan (started with --continue)")
    last = attempts[-1]
    config = read_config_file(last.config_file) or dict(settings.plan_config)
    if last.probe:
        config = {k: v for k, v in config.items() if k not in ("max_train_steps", "output_dir", "output_name")}
        config = ensure_resumable({**settings.plan_config, **config,
                                   "output_dir": settings.plan_config.get("output_dir"),
                                   "output_name": settings.plan_config.get("output_name"),
                                   "max_train_steps": settings.total_steps}, settings.total_steps)
    newest = jr.newest_state(lineage(attempts))
    orphan = unjournaled_state(settings.plan_config.get("output_dir"), newest)
    if orphan is not None and not last.probe:
        newest = orphan
    if newest is not None and newest.step >= settings.total_steps:
        newest = None  # a final state: nothing left to resume into
    tried = frozenset(a.move for a in attempts if a.move)
    if last.outcome in ("oom", "ram") and not last.probe:
        from types import SimpleNamespace

        stored = None
        if newest is not None:
            ts = jr.read_train_state(newest.path)
            stored = ts.get("current_step") if ts else None
        diag = SimpleNamespace(outcome="oom" if last.outcome == "oom" else "error", phase=last.phase, oom=last.oom,
                               error=last.error, advice=last.advice)
        state = RunState(attempt=last.attempt, attempts_left=settings.max_attempts, total_steps=settings.total_steps,
                         plan_config=settings.plan_config, tried=tried, newest_state=newest, stored_step=stored,
                         policy=settings.policy)
        facts = AttemptFacts(exit_status=last.exit_status, end_step=last.end_step, killed=last.outcome == "ram")
        action = decide(diag, config, settings.family, state, facts, dataset=settings.dataset, next_step=next_step)
        if isinstance(action, Retry):
            return Retry(config=action.config, resume_from=action.resume_from, changes=action.changes,
                         reason=f"continued: {action.reason}", move=action.move, start_step=action.start_step,
                         note=action.note, dataset=action.dataset)
        return action
    why = f"continued after attempt {last.attempt} ({last.outcome})"
    if newest is None:
        return Retry(config=config, resume_from=None, changes=[], reason=why,
                     note="no saved state to resume from, so it starts from step 0")
    return Retry(config=config, resume_from=newest.path, changes=[], reason=why, start_step=newest.step,
                 note=f"resumes from the state at step {newest.step}")

