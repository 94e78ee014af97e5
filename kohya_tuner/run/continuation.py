"""`kohya-tuner run --continue OUT`: where a journaled run picks up."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from kohya_tuner import safeio
from kohya_tuner.config_io import flatten
from kohya_tuner.prompts import resizable_size
from kohya_tuner.run.journal import AttemptRecord, Change
from kohya_tuner.run.policy import AttemptFacts, Retry, RunState, Stop, decide, loader_in_process
from kohya_tuner.run.settings import RunSettings, read_config_file
from kohya_tuner.run.states import (AttemptOutput, attempt_name, attempt_outputs, base_name, ensure_resumable,
                                    lineage, lineage_weights, newest_resumable, settle_unfinished)


def continuation(attempts: list[AttemptRecord], settings: RunSettings, *,
                 next_step: Callable[..., Any] | None = None) -> Retry | Stop:
    """How `run --continue` picks up: after an OOM, the decision the loop would have made;
    after an interruption, a hang or an error, the same settings from the newest state.
    The state is the newest complete one on disk that this run's lineage wrote, including
    an attempt the journal never recorded (kohya-tuner itself was killed mid-attempt)."""
    attempts = settle_unfinished(attempts, settings.plan_config, settings.total_steps)
    orphan = unjournaled_attempt(settings, attempts)
    if not attempts and orphan is None:
        return Retry(config=ensure_resumable(settings.plan_config, settings.total_steps), resume_from=None,
                     changes=[], reason="the fitted plan (started with --continue)")
    last = attempts[-1] if attempts else None
    config = (read_config_file(last.config_file, settings.plan_config) if last else None) or dict(settings.plan_config)
    if last is not None and last.probe:
        config = {k: v for k, v in config.items() if k not in ("max_train_steps", "output_dir", "output_name")}
        config = ensure_resumable({**settings.plan_config, **config,
                                   "output_dir": settings.plan_config.get("output_dir"),
                                   "output_name": settings.plan_config.get("output_name"),
                                   "max_train_steps": settings.total_steps}, settings.total_steps)
    base = base_name(settings.plan_config)
    outputs = attempt_outputs(lineage(attempts), base)
    if orphan is not None:
        # A resumed orphan continues the lineage; a fresh one started a new one.
        outputs = outputs + [orphan.output] if orphan.resumed else [orphan.output]
    newest = newest_resumable(settings.plan_config.get("output_dir"), outputs, settings.total_steps)
    tried = frozenset(a.move for a in attempts if a.move)
    if last is not None and orphan is None and last.outcome == "nan_loss":
        from kohya_tuner.run.policy import nan_advice

        # The same settings from the same states diverge again: the change belongs in a new run.
        return Stop(f"attempt {last.attempt} was stopped because its training loss became NaN, and the same "
                    "settings would diverge again", advice=nan_advice(config, settings.family), can_continue=False)
    if last is not None and orphan is None and last.outcome in ("oom", "cpu_oom") and not last.probe:
        from types import SimpleNamespace

        diag = SimpleNamespace(outcome=last.outcome, phase=last.phase, oom=last.oom, error=last.error,
                               advice=last.advice)
        state = RunState(attempt=last.attempt, attempts_left=settings.max_attempts, total_steps=settings.total_steps,
                         plan_config=settings.plan_config, tried=tried, newest_state=newest, policy=settings.policy,
                         cpu=settings.cpu, user_keys=frozenset(settings.user_keys),
                         weights=None if newest else lineage_weights(attempts), processes=settings.num_processes,
                         sample_size=resizable_size(config, settings.family.name))
        facts = AttemptFacts(exit_status=last.exit_status, end_step=last.end_step, killed=last.outcome == "cpu_oom")
        action = decide(diag, config, settings.family, state, facts, dataset=settings.dataset, next_step=next_step)
        if isinstance(action, Retry):
            from dataclasses import replace

            return replace(action, reason=f"continued: {action.reason}")
        return action
    if orphan is not None:
        why = f"continued after attempt {orphan.output.attempt}, which kohya-tuner did not see end"
    else:
        why = f"continued after attempt {last.attempt} ({last.outcome})"
    changes: list[Change] = []
    if last is not None and orphan is None and last.outcome == "hang":
        config, changes = loader_in_process(config)
        if changes:
            why += "; the data loader now runs in the training process (max_data_loader_n_workers 0)"
    weights = lineage_weights(attempts) if newest is None and orphan is None else None
    if weights is not None:
        return Retry(config=config, resume_from=None, changes=changes, reason=why, start_step=weights.step,
                     weights_from=weights.path,
                     note=f"no state saved since it continued from the LoRA weights of step {weights.step}; "
                          "it continues from them again with a fresh optimizer")
    if newest is None:
        return Retry(config=config, resume_from=None, changes=changes, reason=why,
                     note="no saved state to resume from, so it starts from step 0")
    return Retry(config=config, resume_from=newest.path, changes=changes, reason=why, start_step=newest.step,
                 note=f"resumes from the state at step {newest.step}")


@dataclass(frozen=True)
class _Orphan:
    output: AttemptOutput
    resumed: bool


def unjournaled_attempt(settings: RunSettings, attempts: list[AttemptRecord]) -> _Orphan | None:
    """The attempt whose config was written but whose end the journal lacks. Its start step
    follows from its config: a resumed attempt trains the steps left (max_train_steps)."""
    done = max((a.attempt for a in attempts), default=0)
    found = []
    for p in settings.out_dir.glob("attempt-*.config.toml"):
        m = re.match(r"attempt-(\d+)\.config\.toml$", p.name)
        if m and int(m.group(1)) > done:
            found.append((int(m.group(1)), p))
    if not found:
        return None
    number, path = max(found)
    try:
        cfg = flatten(safeio.load_toml_file(path))
    except (OSError, ValueError, TypeError, IndexError, RecursionError):  # damaged: as if absent
        return None
    if "probe" in str(cfg.get("output_name") or ""):
        return None
    resumed = bool(cfg.get("resume")) or _weights_continued(cfg, settings)
    steps = cfg.get("max_train_steps")
    start = settings.total_steps - steps if resumed and isinstance(steps, int) and 0 < steps <= settings.total_steps \
        else 0
    name = str(cfg.get("output_name") or attempt_name(base_name(settings.plan_config), number))
    return _Orphan(AttemptOutput(number, name, start), resumed)


def _weights_continued(cfg: dict, settings: RunSettings) -> bool:
    """An attempt that started from saved LoRA weights (a fresh optimizer after a move):
    its network_weights are not the plan's."""
    return bool(cfg.get("network_weights")) and cfg.get("network_weights") != settings.plan_config.get(
        "network_weights")


def recovered_records(settings: RunSettings, attempts: list[AttemptRecord]) -> list[AttemptRecord]:
    """`attempts` plus a record for each attempt that was launched (its log is there) but
    has neither a journal line nor a pending record: its start from its config, its end
    from its complete states on disk. Without it a lost line would drop that attempt's
    steps from steps done and redone."""
    from kohya_tuner.run.journal import Journal

    known = {a.attempt for a in attempts}
    j = Journal(settings.out_dir)
    extra = []
    for n in sorted(j.numbers_on_disk() - known):
        path = j.config_path(n)
        try:
            cfg = flatten(safeio.load_toml_file(path))
        except (OSError, ValueError, TypeError, IndexError, RecursionError):
            continue
        if "probe" in str(cfg.get("output_name") or ""):
            continue
        steps = cfg.get("max_train_steps")
        resumed = bool(cfg.get("resume")) or _weights_continued(cfg, settings)
        start = (settings.total_steps - steps if resumed and isinstance(steps, int)
                 and 0 < steps <= settings.total_steps else 0)
        extra.append(AttemptRecord(attempt=n, started="", config_file=str(path), log_file=str(j.log_path(n)),
                                   reason="recovered from the files on disk (its journal line was lost)",
                                   resume_from=str(cfg["resume"]) if cfg.get("resume") else None, start_step=start,
                                   end_step=start, total_steps=settings.total_steps, outcome="incomplete"))
    if not extra:
        return attempts
    return sorted(attempts + settle_unfinished(extra, settings.plan_config, settings.total_steps),
                  key=lambda a: a.attempt)
