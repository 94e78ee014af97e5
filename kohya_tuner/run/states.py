"""Resumable states: the resume keys an attempt runs with, and which state a relaunch uses.

States from before a restart from step 0 belong to other settings and are never resumed
into; a state written after the journal's last record (kohya-tuner itself was killed
while the trainer kept saving) is found on disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from kohya_tuner.run import journal as jr
from kohya_tuner.run.journal import AttemptRecord, StateRecord
from kohya_tuner.run.policy import BOOKKEEPING


def ensure_resumable(config: Mapping[str, Any], total_steps: int) -> dict[str, Any]:
    """save_state on, a save cadence scaled to the run, and a bound on kept states."""
    from kohya_tuner.presets import save_cadence

    out = dict(config)
    out["save_state"] = True
    every = out.get("save_every_n_steps")
    if not isinstance(every, int) or every < 1 or every >= total_steps:
        every = save_cadence(total_steps)
        out["save_every_n_steps"] = every
    if not out.get("save_last_n_steps_state"):
        out["save_last_n_steps_state"] = every * 2
    return out


def attempt_config(config: Mapping[str, Any], *, resume_from: str | None, resume_step: int,
                   stored_step: int | None) -> dict[str, Any]:
    """The config an attempt runs with: the settings plus the supervisor's resume keys."""
    out = {k: v for k, v in config.items() if k not in BOOKKEEPING}
    if resume_from:
        out["resume"] = resume_from
        out["skip_until_initial_step"] = True
        if stored_step is not None and stored_step != resume_step:
            # The state's own counter drifted (chained resumes count run-locally);
            # the supervisor's absolute count is the truth.
            out["initial_step"] = resume_step
    return out



def lineage(attempts: list[AttemptRecord]) -> list[AttemptRecord]:
    """The attempts since the last one that started from step 0 (probes excluded):
    states from before a restart belong to other settings."""
    runs = [a for a in attempts if not a.probe]
    start = 0
    for i, a in enumerate(runs):
        if a.resume_from is None and a.start_step == 0:
            start = i
    return runs[start:]




def unjournaled_state(output_dir: str | None, newest: StateRecord | None) -> StateRecord | None:
    """A state written after the journal's last record: kohya-tuner itself was killed
    mid-attempt (a closed terminal, kill -9) while the trainer kept saving. Its step is the
    trainer's own `train_state.json` count, the best there is without the journal."""
    out = output_dir
    if not out or not Path(out).is_dir():
        return None
    floor_mtime = Path(newest.path).stat().st_mtime if newest is not None and Path(newest.path).exists() else 0.0
    best: StateRecord | None = None
    for d in Path(out).iterdir():
        if not d.is_dir() or not d.name.endswith("-state") or d.stat().st_mtime <= floor_mtime:
            continue
        ts = jr.read_train_state(d)
        step = ts.get("current_step") if ts else None
        if not isinstance(step, int) or step <= (newest.step if newest else 0):
            continue
        if best is None or step > best.step:
            best = StateRecord(path=str(d), step=step, attempt=0)
    return best

