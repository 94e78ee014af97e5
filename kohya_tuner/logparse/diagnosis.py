"""From events to one Diagnosis: what happened, where, and what to change.

The phase of a failure comes from context — the last milestone and the last step seen
before it — and only falls back to the traceback frames when the log holds no context
(a pasted excerpt). A log that holds several runs (a file appended to on every retry) is
read as its last run: a new run starts at `Loading settings from` after a finished or
failed one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Literal, Optional

from pydantic import BaseModel, ConfigDict, PrivateAttr

from kohya_tuner.logparse.events import (
    EpochStart, Event, Exited, Failure, Finished, Milestone, ModelFamily, Oom, OomFigures, Progress, Resumed, Saved,
    TotalSteps,
)

Outcome = Literal["oom", "error", "success", "incomplete"]
Phase = Literal["model_load", "cache_latents", "cache_text_encoder", "first_step", "training", "sampling", "saving",
                "unknown"]
ErrorKind = Literal["cpu_oom", "missing_file", "bad_argument", "nan_loss", "xformers", "bitsandbytes",
                    "cuda_unavailable", "distributed", "dtype", "other"]

# Which failure explains a run when several were logged: memory first (a CUDA OOM on one rank
# makes NCCL fail on the others), then specific causes, then the rest; earliest within a rank.
_RANK = {"oom": 0, "cpu_oom": 0, "bad_argument": 1, "missing_file": 1, "xformers": 1, "bitsandbytes": 1,
         "cuda_unavailable": 1, "dtype": 1, "nan_loss": 1, "distributed": 2, "other": 3}
_INTERRUPT_PREFIX = "KeyboardInterrupt"
_KILLED = (137, -9)


class OomInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    tried_gib: Optional[float] = None
    capacity_gib: Optional[float] = None
    free_gib: Optional[float] = None
    process_in_use_gib: Optional[float] = None
    allocated_gib: Optional[float] = None
    reserved_unallocated_gib: Optional[float] = None


class ErrorInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: ErrorKind
    message: str


@dataclass
class DiagnosisDetails:
    """What the diagnosis knows beyond the JSON schema: for rendering and for `run`."""

    family: str | None = None
    exit_status: int | None = None
    model_saved: bool = False
    last_checkpoint: str | None = None
    last_state: str | None = None
    resumed_from: str | None = None
    oom_figures: OomFigures | None = None
    held_elsewhere_gib: float | None = None
    other_processes: tuple[tuple[int, float], ...] = ()
    fragmented: bool = False
    on_cpu: bool = False
    last_milestone: str | None = None
    events: int = 0
    # Failures logged before `model saved.` that did not stop the run.
    survived: list[str] = field(default_factory=list)


class Diagnosis(BaseModel):
    """Exactly the `diagnose --json` schema; `details` carries the rest."""

    outcome: Outcome
    phase: Phase
    step: Optional[int] = None
    total_steps: Optional[int] = None
    last_loss: Optional[float] = None
    oom: Optional[OomInfo] = None
    error: Optional[ErrorInfo] = None
    advice: list[str] = []

    _details: DiagnosisDetails = PrivateAttr(default_factory=DiagnosisDetails)

    @property
    def details(self) -> DiagnosisDetails:
        return self._details

    def to_json(self) -> dict:
        return self.model_dump(mode="json")


@dataclass
class _Failed:
    event: Oom | Failure
    index: int
    phase: str | None
    after_finish: bool


@dataclass
class _Run:
    phase: str | None = None
    finished_at: int | None = None
    max_step: int | None = None
    bar_total: int | None = None
    total: int | None = None
    skipped: int = 0
    last_loss: float | None = None
    failures: list[_Failed] = field(default_factory=list)
    exits: list[tuple[int | None, bool]] = field(default_factory=list)
    last_checkpoint: str | None = None
    last_state: str | None = None
    resumed_from: str | None = None
    on_cpu: bool = False
    last_milestone: str | None = None

    @property
    def ended(self) -> bool:
        return self.finished_at is not None or bool(self.failures) or bool(self.exits)

    def apply(self, ev: Event, index: int) -> None:
        done = self.finished_at is not None
        if isinstance(ev, Progress):
            if ev.total:
                self.bar_total = ev.total
            self.max_step = ev.step if self.max_step is None else max(self.max_step, ev.step)
            if ev.loss is not None:
                self.last_loss = ev.loss
            if not done:
                # A refresh of the bar after a save or a sample means training went on.
                self.phase = "training"
        elif isinstance(ev, Milestone):
            if not done:
                self.phase = ev.phase
            self.last_milestone = ev.name
            if ev.name.startswith("accelerator device:"):
                self.on_cpu = ev.name.endswith(": cpu")
        elif isinstance(ev, EpochStart):
            if not done:
                self.phase = "training"
        elif isinstance(ev, TotalSteps):
            self.total = ev.total
        elif isinstance(ev, Saved):
            if not done:
                self.phase = "saving"
            if ev.what == "state":
                self.last_state = ev.path
            else:
                self.last_checkpoint = ev.path
        elif isinstance(ev, Resumed):
            if ev.path:
                self.resumed_from = ev.path
            if ev.skipped is not None:
                self.skipped = ev.skipped
        elif isinstance(ev, Finished):
            self.finished_at = index
            self.phase = "saving"
        elif isinstance(ev, (Oom, Failure)):
            self.failures.append(_Failed(ev, index, self.phase, done))
        elif isinstance(ev, Exited):
            self.exits.append((ev.status, done))

    def step_phase(self, phase: str | None) -> str | None:
        """`training` before any completed optimizer step is the first step."""
        if phase == "training":
            return "training" if self.max_step else "first_step"
        return phase


def _choose(failures: list[_Failed]) -> _Failed | None:
    best = None
    best_key = None
    for f in failures:
        ev = f.event
        if isinstance(ev, Oom):
            rank = _RANK["oom"]
        elif ev.message.startswith(_INTERRUPT_PREFIX):
            rank = 9
        else:
            rank = _RANK.get(ev.kind, 3)
        key = (rank, f.index)
        if best_key is None or key < best_key:
            best, best_key = f, key
    return best


def _failure_phase(run: _Run, f: _Failed) -> str:
    if f.after_finish:
        return "saving"
    where = f.event.where
    ctx = f.phase
    if ctx is None:
        base = where
    elif ctx == "training" and where in ("sampling", "saving", "cache_latents", "cache_text_encoder"):
        # The bar says training; the frames name the part of the step loop that failed.
        base = where
    elif ctx in ("sampling", "saving") and where == "training":
        # sd-scripts refreshes the bar after sampling or saving; without that refresh the
        # frames still show the failure came from the next training step.
        base = where
    else:
        base = ctx
    if base == "saving" and isinstance(f.event, Oom) and where != "saving":
        # Saving a LoRA or a state copies tensors to the CPU and allocates next to nothing on
        # the GPU: an OOM after a save began, with no save in its frames, is the next step's.
        base = "training" if run.max_step is not None else base
    if base is None:
        if run.max_step is not None:
            base = "training"
        elif isinstance(f.event, Failure) and f.event.kind == "bad_argument":
            # Arguments are read before anything else: the earliest phase there is.
            return "model_load"
        else:
            return "unknown"
    return run.step_phase(base) or "unknown"


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def diagnose(events: Iterable[Event], exit_status: int | None = None, *, family: str | None = None) -> Diagnosis:
    """One Diagnosis for a run's events. `exit_status` is the trainer's (or the launcher's)
    exit code when known; `family` (sd15, sdxl, flux) sharpens the advice."""
    from kohya_tuner.advice import advise

    run = _Run()
    seen_family: str | None = None
    count = 0
    for index, ev in enumerate(events):
        count += 1
        if isinstance(ev, ModelFamily):
            seen_family = ev.family
            continue
        if isinstance(ev, Milestone) and ev.name == "start" and run.ended:
            run = _Run()
        run.apply(ev, index)

    fam = family or seen_family
    log_status = None
    log_failed_exit = False
    for status, _after in run.exits:
        if status is not None:
            log_status = status
        if status is None or status != 0:
            log_failed_exit = True
    status = exit_status if exit_status is not None else log_status
    killed = status in _KILLED or log_status in _KILLED
    failed_exit = (status is not None and status != 0) or (exit_status is None and log_failed_exit)

    finished = run.finished_at is not None
    survived: list[str] = []
    fatal: list[_Failed] = []
    for f in run.failures:
        is_nan = isinstance(f.event, Failure) and f.event.kind == "nan_loss"
        if finished and not f.after_finish and not is_nan and not failed_exit:
            survived.append(_message(f.event))
        else:
            fatal.append(f)
    primary = _choose(fatal)

    outcome: str
    phase: str
    oom: OomInfo | None = None
    error: ErrorInfo | None = None
    figures: OomFigures | None = None
    if primary is not None and isinstance(primary.event, Oom):
        outcome = "oom"
        phase = _failure_phase(run, primary)
        figures = primary.event.figures
        oom = OomInfo(**figures.schema_dict())
    elif primary is not None and primary.event.message.startswith(_INTERRUPT_PREFIX):
        outcome = "incomplete"
        phase = _failure_phase(run, primary)
    elif primary is not None:
        outcome = "error"
        phase = _failure_phase(run, primary)
        message = primary.event.message
        if primary.after_finish:
            message = f"after `model saved.` (the final model file was written): {message}"
        error = ErrorInfo(kind=primary.event.kind, message=message)
    elif killed:
        outcome = "error"
        phase = run.step_phase(run.phase) or "unknown"
        error = ErrorInfo(kind="cpu_oom", message=(
            "the trainer was killed by signal 9 (SIGKILL) without an error message: most likely the system ran "
            "out of RAM and its out-of-memory killer stopped it"))
    elif failed_exit:
        outcome = "error"
        phase = "saving" if finished else (run.step_phase(run.phase) or "unknown")
        code = f"status {status}" if status is not None else "an error status"
        if finished:
            message = (f"the trainer exited with {code} after `model saved.`: the final model file was written, "
                       "then the process crashed")
        else:
            message = f"the trainer exited with {code} and the log holds no error message"
        if status is not None and status < 0:
            message += f" (signal {-status})"
        error = ErrorInfo(kind="other", message=message)
    elif finished:
        outcome = "success"
        phase = "saving"
    else:
        outcome = "incomplete"
        phase = run.step_phase(run.phase) or "unknown"

    step = None if run.max_step is None else run.max_step + run.skipped
    total = run.total if run.total is not None else (
        run.bar_total + run.skipped if run.bar_total is not None else None)
    details = DiagnosisDetails(
        family=fam, exit_status=status, model_saved=finished, last_checkpoint=run.last_checkpoint,
        last_state=run.last_state, resumed_from=run.resumed_from, oom_figures=figures,
        held_elsewhere_gib=figures.held_elsewhere_gib if figures else None,
        other_processes=figures.other_processes if figures else (), fragmented=bool(figures and figures.fragmented),
        on_cpu=run.on_cpu, last_milestone=run.last_milestone, events=count, survived=survived,
    )
    diagnosis = Diagnosis(outcome=outcome, phase=phase, step=step, total_steps=total,
                          last_loss=_finite(run.last_loss), oom=oom, error=error)
    diagnosis._details = details
    diagnosis.advice = advise(diagnosis, details)
    return diagnosis


def _message(ev: Oom | Failure) -> str:
    return ev.figures.message if isinstance(ev, Oom) else ev.message
