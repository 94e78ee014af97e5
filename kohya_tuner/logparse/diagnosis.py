"""From events to one Diagnosis: what happened, where, and what to change.

The phase of a failure comes from the strongest evidence there is: the traceback frames when
they name the trainer's own call or a library entry point with one meaning (frames.toml),
then the last milestone before the failure, then generic frames; the progress bar (before or
after the failure: tqdm often prints its last refresh after the traceback) splits the training
step into the first step and later steps. A log that holds several runs (a file appended to on
every retry) is read as its last run: a new run starts at `Loading settings from` after a
finished or failed one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable

from kohya_tuner.logparse import patterns as P
from kohya_tuner.logparse.advice import advise
from kohya_tuner.logparse.events import (
    BAR_REDRAWN, CACHE_CHECK, CACHE_LOOKUP, CACHE_PHASES, CACHE_READ, JOB_RECORD, REPORTED_WHERE, SETTINGS_PRINTED,
    TRAINING_HEADER,
    EpochStart, Event, Exited, Failure, Finished, Milestone, ModelFamily, Oom, OomFigures, Processes, Progress,
    Restart, Resumed, Saved, TotalSteps, Wrapper,
)
from kohya_tuner.logparse.frames import JOB_CODE_LEVEL, runs_other_phases, wrapper_rank
from kohya_tuner.logparse.result import Diagnosis, DiagnosisDetails, ErrorInfo, OomInfo

# Which failure explains a run when several were logged: memory first (a CUDA OOM on one rank
# makes NCCL fail on the others), then specific causes, then the rest; earliest within a rank.
_RANK = {"oom": 0, "cpu_oom": 0, "bad_argument": 1, "missing_file": 1, "xformers": 1, "bitsandbytes": 1,
         "cuda_error": 1, "cuda_unavailable": 1, "dtype": 1, "nan_loss": 1, "distributed": 2, "other": 3,
         "truncated": 3}
_INTERRUPT_PREFIX = "KeyboardInterrupt"
_KILLED = (137, -9)
# Frames at this level or below outrank the milestones (frames.toml: 1 = the trainer's own
# call, 2 = a library entry point with one meaning, 3 = generic internals).
_STRONG_FRAME = 2
# sd-scripts' first record ("Loading settings from"): a training script starting.
_RUN_START = "start"


@dataclass
class _Failed:
    event: Oom | Failure
    index: int
    phase: str | None
    after_finish: bool
    # The first milestone logged after it (a wrapper's "Text Encoder Caching failed" report).
    phase_after: str | None = None
    # The frame evidence of the cut traceback printed after it, when it has none of its own.
    borrowed_frame: str | None = None
    # It came right after a training header, before any sign that the loop began.
    after_header: bool = False


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
    # (status, after the final save, the phase the run was in when the launcher reported it).
    exits: list[tuple[int | None, bool, str | None]] = field(default_factory=list)
    last_checkpoint: str | None = None
    last_state: str | None = None
    resumed_from: str | None = None
    on_cpu: bool = False
    last_milestone: str | None = None
    processes: int | None = None
    # A fresh run's header for its second epoch or a later one ("epoch 5/100") means whole
    # epochs of steps are done even where no bar shows a count (not so for a resumed run).
    later_epoch: bool = False
    # A training bar redrawn with its counts cut but a share above 0 % (events.BAR_REDRAWN): some
    # step has finished although no count says which.
    bar_moved: bool = False
    # The training bar reached its total: the steps are done, what loads a model now is the
    # script's final inference or validation with what it trained.
    steps_done: bool = False
    # The caching phase a caching script's command or logger named, while that script runs.
    process_phase: str | None = None
    # A training header was the last thing said (events.TRAINING_HEADER): start-up's end.
    after_header: bool = False
    # Where the job first logged a record that names no stage (events.JOB_RECORD).
    job_said: int | None = None

    @property
    def ended(self) -> bool:
        return self.finished_at is not None or bool(self.failures) or bool(self.exits)

    def apply(self, ev: Event, index: int) -> None:
        done = self.finished_at is not None
        header, self.after_header = self.after_header, False
        if isinstance(ev, Milestone) and ev.name == TRAINING_HEADER and not done and self.max_step is None:
            # The figures before the loop's first step: start-up until the loop shows (the convention's
            # training-header clause); a bar after it is the loop's.
            self.phase = "model_load"
            self.after_header = True
            self.last_milestone = ev.name
            return
        if isinstance(ev, (Oom, Failure, Wrapper, ModelFamily, Processes, TotalSteps)):
            self.after_header = header
        if isinstance(ev, Progress):
            if ev.total:
                self.bar_total = ev.total
            self.steps_done = bool(ev.total) and ev.step >= ev.total
            self.max_step = ev.step if self.max_step is None else max(self.max_step, ev.step)
            if ev.loss is not None:
                self.last_loss = ev.loss
            if not done and not (self.steps_done and self.phase in ("saving", "sampling")):
                # A refresh of the bar after a save or a sample means training went on; a bar at its
                # total has no step left to go on to (the loop's last refresh, printed after the save).
                self.phase = "training"
                self.process_phase = None
        elif isinstance(ev, Milestone):
            if ev.name == BAR_REDRAWN:
                self.bar_moved = True
            if ev.name == JOB_RECORD:
                if self.job_said is None:
                    self.job_said = index
                return
            if ev.name == CACHE_READ and self.phase == "training" and self.max_step is not None:
                # Steps are being counted: the training step reading its cache.
                return
            if ev.name == SETTINGS_PRINTED and self.max_step is not None:
                return
            if ev.name == CACHE_LOOKUP and self.phase is not None and self.phase != "model_load":
                return
            if ev.name == CACHE_CHECK and self.phase in CACHE_PHASES:
                return
            phase = None if ev.phase == "unknown" else ev.phase
            if ev.process or ev.name == _RUN_START:
                self.process_phase = phase if phase in CACHE_PHASES else None
            elif phase == "model_load" and self.process_phase is not None:
                # A caching script loading its model or reading its dataset: still its pass.
                phase = self.process_phase
            elif phase == "model_load" and self.phase == "sampling" and self.max_step is not None:
                # A sample or a validation pass between steps building the pipeline it runs.
                phase = "sampling"
            for f in reversed(self.failures):
                if f.phase_after is not None or phase is None or phase == "model_load":
                    # Start-up after a failure is a start again (a GUI's next job, a retry), not
                    # the failed one's report of where it was.
                    break
                f.phase_after = phase
            if not done:
                self.phase = phase
            self.last_milestone = ev.name
            if ev.name.startswith("accelerator device:"):
                self.on_cpu = ev.name.endswith(": cpu")
        elif isinstance(ev, EpochStart):
            if not done:
                self.phase = "training"
            if ev.epoch >= 2 and self.resumed_from is None and not self.skipped:
                self.later_epoch = True
        elif isinstance(ev, TotalSteps):
            self.total = ev.total
            if not done and self.max_step is None and self.phase in (None, "model_load", *CACHE_PHASES):
                # The step count a trainer works out before its loop (the header's "Total optimization
                # steps = N", sd-scripts' "override steps"): what was set up is behind it, the loop not
                # yet begun, so start-up by the same training-header clause.
                self.phase = "model_load"
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
                if not done and self.max_step is None:
                    # A saved state is loaded before the first step: start-up.
                    self.phase = "model_load"
            if ev.skipped is not None:
                self.skipped = ev.skipped
        elif isinstance(ev, Finished):
            self.finished_at = index
            self.phase = "saving"
        elif isinstance(ev, (Oom, Failure)):
            if isinstance(ev, Failure) and ev.chained and self.failures and isinstance(self.failures[-1].event, Failure):
                # A traceback raised while handling the error before it, cut before its own error
                # line: the run ended in it (its message names the earlier error).
                self.failures.pop()
            self.failures.append(_Failed(ev, index, self.phase, done, after_header=header))
        elif isinstance(ev, Exited):
            self.exits.append((ev.status, done, self.phase))
        elif isinstance(ev, Processes):
            self.processes = max(self.processes or 1, ev.count)

    def step_phase(self, phase: str | None) -> str | None:
        """`training` before any completed optimizer step is the first step; loading a model
        after the last step is the inference that follows training (a script loads a pipeline
        with what it trained to sample from it)."""
        if phase == "training":
            return "training" if self.max_step or self.later_epoch or self.bar_moved else "first_step"
        if phase == "model_load" and self.steps_done and self.finished_at is None:
            return "sampling"
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


def _traceback_of_report(report: Failure, later: Failure) -> bool:
    """Whether `later` is the traceback of the error a program reported in its own words before it ("An
    error occurred during training: <message>", "Exception while training: …"): the same message again,
    or a traceback cut before its error line; its frames, not the report's words, say where it was."""
    if later.frame in (None, REPORTED_WHERE) or (later.frame_level or _STRONG_FRAME) > _STRONG_FRAME:
        return False
    if later.kind == "truncated":
        return True
    _, sep, text = later.message.partition(": ")
    return bool(sep) and len(text) >= 20 and report.message.endswith(text)


def _failure_phase(run: _Run, f: _Failed) -> tuple[str, str | None]:
    """(phase, what decided it: "frames", "context", "after" (a milestone after it), "progress" or None)."""
    if f.after_finish:
        return "saving", "context"
    ev = f.event
    where = ev.where
    level = ev.frame_level if ev.frame_level is not None else _STRONG_FRAME
    reported = isinstance(ev, Failure) and ev.frame == REPORTED_WHERE
    if where is None or reported:
        # The OOM message printed before its own traceback (stderr order) and the traceback
        # then cut: the frames of the cut traceback that follows are this OOM's. A failure
        # reported in several lines (NCCL's watchdog: "Some NCCL operations have failed", then
        # which collective timed out) takes the evidence of the later line of its kind.
        # An error's record printed before its traceback (a job runner's "Error running job: …")
        # takes the frames of the cut traceback after it as well, and so does a program's report
        # that names a phase in its words (`_traceback_of_report`).
        same = ("truncated", "truncated") if isinstance(ev, Oom) else (ev.kind, "truncated")
        after = next((g.event for g in run.failures if g.index > f.index and isinstance(g.event, Failure)
                      and g.event.kind in same and g.event.where
                      and (not reported or _traceback_of_report(ev, g.event))), None)
        if after is not None:
            where, level = after.where, after.frame_level if after.frame_level is not None else _STRONG_FRAME
            f.borrowed_frame = after.frame
    ctx = f.phase
    job_code = None
    if where is not None and level >= JOB_CODE_LEVEL:
        # The job's own code with nothing more telling: start-up, but only where nothing else
        # (a milestone, what follows, a counted step) places the failure.
        job_code, where = where, None
    if where is not None and (level <= _STRONG_FRAME or ctx is None or (f.after_header and where == "training")):
        # (After a training header any frame of the step shows the loop began.)
        base, evidence = where, "frames"
    elif ctx in ("sampling", "saving") and where == "training" and not runs_other_phases(f.event.frame):
        # sd-scripts refreshes the bar after sampling or saving; without that refresh the
        # frames still show the failure came from the next training step.
        base, evidence = where, "frames"
    else:
        base, evidence = ctx, ("context" if ctx is not None else None)
    if base in ("cache_latents", "cache_text_encoder") and evidence == "frames" and ctx == "training" \
            and run.max_step is not None:
        # Caching code once the training bar is shown, with no caching milestone since: the
        # training step reading a cached latent or text embed (or computing one it lacks).
        base, evidence = "training", "progress"
    if base == "model_load" and evidence == "frames" and ctx == "saving" and run.max_step is not None:
        # Loading a model after steps were counted and a save began: the save building the
        # pipeline it writes (diffusers' scripts save through `from_pretrained(…, unet=unwrap_model(…))`).
        base, evidence = "saving", "context"
    if base == "saving" and isinstance(ev, Oom) and where != "saving":
        # Saving a LoRA or a state copies tensors to the CPU and allocates next to nothing on
        # the GPU: an OOM after a save began, with no save in its frames, is the next step's.
        if run.max_step is not None:
            base, evidence = "training", "progress"
    if base is None and f.phase_after is not None and run.max_step is None:
        # Nothing before it tells; what the log says right after it does.
        base, evidence = f.phase_after, "after"
    if base is None:
        if run.max_step is not None:
            base, evidence = "training", "progress"
        elif job_code is not None:
            base, evidence = job_code, "frames"
        elif run.job_said is not None and run.job_said < f.index:
            # The job was logging and had not stepped: by the start-up convention it was starting.
            base, evidence = "model_load", "context"
        elif isinstance(ev, Failure) and ev.kind in ("bad_argument", "distributed"):
            # Arguments are read, and the process group (NCCL) is started, before anything
            # else: the earliest phase there is.
            return "model_load", None
        else:
            return "unknown", None
    return run.step_phase(base) or "unknown", evidence


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def diagnose(events: Iterable[Event], exit_status: int | None = None, *, family: str | None = None) -> Diagnosis:
    """One Diagnosis for a run's events. `exit_status` is the trainer's (or the launcher's)
    exit code when known; `family` (sd15, sdxl, flux) sharpens the advice; without it the
    advice is specific only to the family the log shows."""
    run = _Run()
    seen_family: str | None = None
    seen_strength = 1 << 30
    wrapper: str | None = None
    count = 0
    for index, ev in enumerate(events):
        count += 1
        if isinstance(ev, ModelFamily):
            if ev.family == seen_family or ev.strength <= seen_strength:
                seen_family, seen_strength = ev.family, min(seen_strength, ev.strength)
            continue
        if isinstance(ev, Wrapper):
            if wrapper_rank(ev.wrapper) < wrapper_rank(wrapper):
                wrapper = ev.wrapper
            continue
        if isinstance(ev, Restart):
            run = _Run()
            continue
        if isinstance(ev, Milestone) and ev.name == _RUN_START and run.ended:
            run = _Run()
        run.apply(ev, index)

    fam = family or seen_family
    family_source = "given" if family else ("log" if seen_family else None)
    log_status = None
    log_failed_exit = False
    for status, _after, _phase in run.exits:
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
    evidence: str | None = None
    frame: str | None = None
    suspected: str | None = None
    error_line = True
    failed_rank: int | None = None
    if primary is not None:
        frame = primary.event.frame
    if primary is not None and isinstance(primary.event, Oom):
        outcome = "oom"
        phase, evidence = _failure_phase(run, primary)
        frame = frame or primary.borrowed_frame
        figures = primary.event.figures
        oom = OomInfo(**figures.schema_dict())
        failed_rank = primary.event.rank
    elif primary is not None and primary.event.message.startswith(_INTERRUPT_PREFIX):
        outcome = "incomplete"
        phase, evidence = _failure_phase(run, primary)
    elif primary is not None:
        outcome = "error"
        phase, evidence = _failure_phase(run, primary)
        message = primary.event.message
        if primary.event.kind == "truncated":
            suspected = primary.event.suspected
            error_line = False
            message = _truncated_message(message, suspected, phase, frame)
        if primary.after_finish:
            message = f"after `model saved.` (the final model file was written): {message}"
        error = ErrorInfo(kind=primary.event.kind, message=message)
    elif killed:
        outcome = "error"
        error_line = False
        phase = run.step_phase(run.phase) or "unknown"
        error = ErrorInfo(kind="cpu_oom", message=(
            "the trainer was killed by signal 9 (SIGKILL) without an error message: most likely the system ran "
            "out of RAM and its out-of-memory killer stopped it"))
    elif failed_exit:
        outcome = "error"
        error_line = False
        # The phase when the launcher reported the exit: what follows it (a GUI setting its next
        # job up) is not the failed run's.
        at_exit = next((ph for st, _after, ph in run.exits if st is None or st != 0), run.phase)
        phase = "saving" if finished else (run.step_phase(at_exit) or "unknown")
        code = f"status {status}" if status is not None else "an error status"
        if finished:
            message = (f"the trainer exited with {code} after `model saved.`: the final model file was written, "
                       "then the process crashed")
        else:
            message = f"the trainer exited with {code} and the log holds no error message"
        windows = P.windows_status(status)
        if windows is not None:
            message += f" ({windows})"
        elif status is not None and status < 0:
            message += f" (signal {-status})"
        error = ErrorInfo(kind="other", message=message)
    elif finished:
        outcome = "success"
        phase = "saving"
    else:
        outcome = "incomplete"
        phase = run.step_phase(run.phase) or "unknown"

    if error is not None and error.kind == "cpu_oom":
        # Host RAM, not the GPU: its own outcome, as in `run`'s attempt records.
        outcome = "cpu_oom"
    step = None if run.max_step is None else run.max_step + run.skipped
    total = run.total if run.total is not None else (
        run.bar_total + run.skipped if run.bar_total is not None else None)
    if evidence is None and primary is None and run.phase is not None:
        evidence = "context"
    details = DiagnosisDetails(
        family=fam, family_source=family_source, wrapper=wrapper, exit_status=status, model_saved=finished, last_checkpoint=run.last_checkpoint,
        last_state=run.last_state, resumed_from=run.resumed_from, oom_figures=figures,
        held_elsewhere_gib=figures.held_elsewhere_gib if figures else None,
        other_processes=figures.other_processes if figures else (), trainer_pid=figures.trainer_pid if figures else None,
        fragmented=bool(figures and figures.fragmented), on_cpu=run.on_cpu, processes=run.processes, failed_rank=failed_rank,
        last_milestone=run.last_milestone,
        phase_evidence=evidence, frame=frame, suspected=suspected, error_line=error_line, events=count, survived=survived,
    )
    diagnosis = Diagnosis(outcome=outcome, phase=phase, step=step, total_steps=total,
                          last_loss=_finite(run.last_loss), oom=oom, error=error, family=fam, wrapper=wrapper)
    diagnosis._details = details
    diagnosis.advice = advise(diagnosis, details)
    return diagnosis


_SUSPECTED_WORDS = {"oom": "likely out of GPU memory (the wording around it says so)"}


def _truncated_message(message: str, suspected: str | None, phase: str, frame: str | None) -> str:
    parts = [message]
    if frame:
        parts.append(f"the frames show {frame}")
    if suspected:
        parts.append(_SUSPECTED_WORDS.get(suspected, f"a warning before it points to {suspected.replace('_', ' ')}"))
    else:
        parts.append("what failed cannot be told without the error line")
    return "; ".join(parts)


def _message(ev: Oom | Failure) -> str:
    return ev.figures.message if isinstance(ev, Oom) else ev.message
