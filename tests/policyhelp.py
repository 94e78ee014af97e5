"""The move `run` would make after an out-of-memory error, decided on a planned run's folder.

`run --dry-run` writes run.json (the plan, the dataset, the keys the user set) and launches
nothing; `decision_after_oom` feeds that to the supervisor's pure `decide()` with the diagnosis
of a training-phase OOM and the state the failure saved, as the loop would after attempt 1.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from kohya_tuner.families import get_family
from kohya_tuner.run.journal import StateRecord
from kohya_tuner.run.policy import AttemptFacts, Retry, RunState, Stop, decide


def decision_after_oom(out: Path, *, end_step: int, tried_mib: float, free_mib: float) -> tuple[Retry | Stop, str]:
    """What `run` does when attempt 1 of the run planned in `out` runs out of memory while
    training after `end_step` steps, the state of that step saved: (the action, that state's path)."""
    settings = json.loads((out / "run.json").read_text(encoding="utf-8"))
    plan = settings["plan_config"]
    saved = str(out / "output" / f"lora-step{end_step:08d}-state")
    state = RunState(attempt=1, attempts_left=settings["max_attempts"] - 1, total_steps=settings["total_steps"],
                     plan_config=plan, newest_state=StateRecord(saved, end_step, 1), policy=settings["policy"],
                     cpu=settings["cpu"], user_keys=frozenset(settings["user_keys"]))
    diagnosis = SimpleNamespace(outcome="oom", phase="training", error=None, advice=[],
                                oom=SimpleNamespace(tried_gib=tried_mib / 1024, free_gib=free_mib / 1024))
    action = decide(diagnosis, plan, get_family(settings["family"]), state,
                    AttemptFacts(exit_status=1, end_step=end_step), dataset=settings["dataset"])
    return action, saved
