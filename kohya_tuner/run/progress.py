"""Absolute progress of one attempt, from the log reader's events.

sd-scripts counts steps from the resume point and names states by its own counter, so an
attempt's absolute step is its start step plus the progress bar's count. Pure: fed with
parser events, it touches no files.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from kohya_tuner.run.journal import StateRecord

_STATE_STEP = re.compile(r"-step(\d+)-state$")

@dataclass
class Progress:
    """Absolute progress of one attempt from its parser events."""

    start_step: int
    total_steps: int
    attempt: int
    t0: float = field(default_factory=time.monotonic)
    run_step: int = 0  # the progress bar's own count
    run_total: int | None = None
    loss: float | None = None
    rate: float | None = None
    states: list[StateRecord] = field(default_factory=list)
    losses: list[list[float]] = field(default_factory=list)
    final_model: str | None = None
    reported_total: int | None = None

    @property
    def step(self) -> int:
        return self.start_step + self.run_step

    @property
    def eta_s(self) -> float | None:
        if not self.rate:
            return None
        return max(0.0, (self.total_steps - self.step) / self.rate)

    def on_progress(self, step: int, total: int | None, loss: float | None, rate: float | None) -> None:
        self.run_step = max(self.run_step, int(step))
        self.run_total = total
        if rate:
            self.rate = rate
        if loss is not None:
            self.loss = loss
            point = [round(time.monotonic() - self.t0, 2), self.step, float(loss)]
            if not self.losses or self.losses[-1][1] != point[1] or self.losses[-1][2] != point[2]:
                self.losses.append(point)

    def on_saved(self, what: str, path: str) -> StateRecord | None:
        if what == "state":
            # A resumed attempt is a run of its own that counts from 0: its state names carry
            # its own step, ahead of the bar when the bar's last refresh was not printed.
            step = self.step
            m = _STATE_STEP.search(path.rstrip("/\\"))
            if m:
                step = max(step, min(self.total_steps, self.start_step + int(m.group(1))))
            rec = StateRecord(path=path, step=step, attempt=self.attempt)
            self.states = [s for s in self.states if s.path != path] + [rec]
            return rec
        if path.endswith((".safetensors", ".ckpt", ".pt")) and "-step" not in Path(path).name and not re.search(
                r"-\d{6}\.(safetensors|ckpt|pt)$", path):
            self.final_model = path
        return None


# ---- the loop ----------------------------------------------------------------------------------
