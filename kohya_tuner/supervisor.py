"""The attempt loop of `kohya-tuner run`: launch, watch, decide, relaunch.

`decide()` is pure: from the diagnosis of one attempt, its config and what the run
knows so far, it returns `Retry(config, resume_from, changes, reason)` or
`Stop(reason)`. Only an out-of-memory failure (GPU or host RAM) is retried; anything
else stops with its diagnosis, because retrying a wrong path or a broken install with
less memory only wastes the user's time.

Resuming: sd-scripts restarts its step counter and its file numbering on resume, and
without `skip_until_initial_step` it retrains the interrupted epoch from its start.
So the supervisor tracks absolute optimizer steps itself (the attempt's starting step
plus the progress bar's count), records the absolute step of every state it sees
saved, and resumes with `resume` + `skip_until_initial_step` (+ `initial_step` when
the state's own `train_state.json` disagrees with the record), keeping
`max_train_steps` and the effective batch so the total equals the plan.

`Supervisor` is the impure loop around `decide()`: it writes attempt configs, starts
the trainer through `launcher`, feeds its output to the log parser, samples VRAM,
writes the journal and the report, and appends the measured peak to the history.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from kohya_tuner import journal as jr
from kohya_tuner.families import Family
from kohya_tuner.journal import AttemptRecord, Change, Journal, StateRecord

# Settings a state directory pins (loading fails or silently disagrees if they change):
# the network's shape and parameter groups, the optimizer's state format, the fp16 scaler.
RESUME_PINNED = frozenset({
    "network_module", "network_dim", "network_alpha", "network_args", "network_train_unet_only",
    "network_train_text_encoder_only", "optimizer_type", "use_8bit_adam", "use_lion_optimizer", "dim_from_weights",
    "conv_dim", "conv_alpha", "loraplus_lr_ratio", "loraplus_unet_lr_ratio", "loraplus_text_encoder_lr_ratio",
})
# Keys that only decide when and how sample images are made.
SAMPLING_KEYS = ("sample_every_n_steps", "sample_every_n_epochs", "sample_at_first")
# Keys the supervisor owns on every attempt.
BOOKKEEPING = ("resume", "skip_until_initial_step", "initial_step")
_STATE_STEP = re.compile(r"-step(\d+)-state$")
_KILLED = re.compile(r"(died with <Signals\.SIGKILL: 9>|exit status -9\b|exit status 137\b|Killed\s*$)")

DEFAULT_MAX_ATTEMPTS = 6
DEFAULT_HANG_MINUTES = 30.0


# ---- values -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Retry:
    config: dict[str, Any]
    resume_from: str | None
    changes: list[Change]
    reason: str
    move: str | None = None
    start_step: int = 0
    # Why it restarts from step 0 although states exist, or why it resumes.
    note: str | None = None
    # The dataset config when a move changed it (None: unchanged).
    dataset: dict[str, Any] | None = None


@dataclass(frozen=True)
class Stop:
    reason: str
    status: str = "failed"  # success, failed, interrupted
    advice: tuple[str, ...] = ()
    # False when continuing would only stop again (the ladder's floor).
    can_continue: bool = True


@dataclass
class AttemptFacts:
    """What the loop observed about one attempt, beside the log diagnosis."""

    exit_status: int | None
    end_step: int = 0
    hung: bool = False
    interrupted: bool = False
    killed: bool = False  # SIGKILL without traceback: the kernel's OOM killer (host RAM)
    final_model: str | None = None
    hang_minutes: float | None = None


@dataclass
class RunState:
    """What `decide` may know about the run beyond the last attempt (all plain data)."""

    attempt: int  # number of the attempt just finished
    attempts_left: int  # how many more may be launched
    total_steps: int
    plan_config: dict[str, Any]
    tried: frozenset[str] = frozenset()
    newest_state: StateRecord | None = None
    stored_step: int | None = None  # current_step in that state's train_state.json
    probe: bool = False
    policy: str = "default"


# ---- pure helpers ---------------------------------------------------------------------------


def diff_configs(old: Mapping[str, Any], new: Mapping[str, Any], ignore=BOOKKEEPING) -> list[Change]:
    keys = sorted(set(old) | set(new))
    return [Change(k, old.get(k), new.get(k)) for k in keys if k not in ignore and old.get(k) != new.get(k)]


def apply_changes(config: Mapping[str, Any], changes) -> dict[str, Any]:
    out = dict(config)
    for key, _old, new in changes:
        if new is None:
            out.pop(key, None)
        else:
            out[key] = new
    return out


def effective_batch(config: Mapping[str, Any]) -> int:
    return int(config.get("train_batch_size") or 1) * int(config.get("gradient_accumulation_steps") or 1)


def keep_effective_batch(config: dict[str, Any], target: int) -> tuple[dict[str, Any], str | None]:
    """Raise gradient accumulation after a batch cut so each optimizer step still sees
    `target` images: the plan's step count and learning rate stay meaningful."""
    batch = int(config.get("train_batch_size") or 1)
    if effective_batch(config) == target:
        return config, None
    if target % batch:
        return config, (f"effective batch {target} is not a multiple of batch {batch}; "
                        f"it is {effective_batch(config)} now")
    if config.get("fused_backward_pass"):
        return config, "fused_backward_pass needs gradient accumulation 1; the effective batch shrinks"
    out = dict(config)
    accum = target // batch
    if accum == 1:
        out.pop("gradient_accumulation_steps", None)
    else:
        out["gradient_accumulation_steps"] = accum
    return out, None


def resume_unsafe(changes) -> list[str]:
    """Changed keys a saved state cannot follow."""
    bad = []
    for c in changes:
        key, old, new = (c.key, c.old, c.new) if isinstance(c, Change) else c
        if key in RESUME_PINNED:
            bad.append(key)
        elif key == "mixed_precision" and new == "fp16" and old != "fp16":
            bad.append(key)  # the state has no fp16 grad-scaler to load
    return bad


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


def sampling_changes(config: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """Sampling off for the rest of the run; nothing else changes."""
    return [(k, config.get(k), None) for k in SAMPLING_KEYS if config.get(k) is not None]


def ram_changes(config: Mapping[str, Any], family: Family, tried: frozenset[str]) -> tuple[str, list, str] | None:
    """The next host-RAM move: (name, changes, why), cheapest first."""
    workers = config.get("max_data_loader_n_workers")
    if "ram_workers" not in tried and (workers is None or workers > 0):
        return ("ram_workers", [("max_data_loader_n_workers", workers, 0),
                                ("persistent_data_loader_workers", config.get("persistent_data_loader_workers"), None)],
                "each data-loader worker is a copy of the Python process; load in the main process instead")
    if "ram_disk_caches" not in tried:
        ch = []
        if config.get("cache_latents") and not config.get("cache_latents_to_disk"):
            ch.append(("cache_latents_to_disk", config.get("cache_latents_to_disk"), True))
        if family.has_te_cache and config.get("cache_text_encoder_outputs") and not config.get(
                "cache_text_encoder_outputs_to_disk"):
            ch.append(("cache_text_encoder_outputs_to_disk", None, True))
        if ch:
            return ("ram_disk_caches", ch, "caches on disk instead of in RAM")
    if "ram_lowram" not in tried and not config.get("lowram"):
        return ("ram_lowram", [("lowram", config.get("lowram"), True)],
                "load the models straight onto the GPU instead of staging them in RAM")
    return None


def deficit_gib(oom: Any) -> float | None:
    """How much more the failed allocation needed than the card had free."""
    if oom is None:
        return None
    tried = _get(oom, "tried_gib")
    free = _get(oom, "free_gib")
    if tried is None:
        return None
    return max(0.0, float(tried) - float(free or 0.0))


def _get(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _step_changes(step: Any) -> list[tuple[str, Any, Any]]:
    return [tuple(c) if not isinstance(c, Change) else (c.key, c.old, c.new) for c in _get(step, "changes") or []]


def _is_sampling(phase: str | None) -> bool:
    return bool(phase) and "sampl" in str(phase).lower()


_PHASE_WORDS = {
    "model_load": "loading the model", "cache_latents": "caching latents",
    "cache_text_encoder": "caching text-encoder outputs", "first_step": "the first step", "training": "training",
    "sampling": "sampling", "saving": "saving",
}


def phase_words(phase: str | None) -> str:
    """" while loading the model" and the like; empty when the phase is unknown."""
    if not phase or phase == "unknown":
        return ""
    words = _PHASE_WORDS.get(str(phase), str(phase).replace("_", " "))
    return f" during {words}" if phase == "first_step" else f" while {words}"


def _when(step: int) -> str:
    return f"after step {step}" if step else "before the first step"


def ladder_phase(phase: str | None) -> str:
    """The ladder knows the phases of a run; the log reader also says "first_step" (the
    first optimizer step, which is training) and "unknown"."""
    if not phase or phase in ("first_step", "unknown"):
        return "training"
    return str(phase)


def decide(diagnosis: Any, config: Mapping[str, Any], family: Family, state: RunState, facts: AttemptFacts, *,
           dataset: Mapping[str, Any] | None = None, next_step: Callable[..., Any] | None = None) -> Retry | Stop:
    """What to do after an attempt ended. Pure: everything it needs comes in as values.

    `next_step` is the memory ladder's `next_step` (injectable for tests)."""
    outcome = _get(diagnosis, "outcome")
    phase = _get(diagnosis, "phase")
    error_kind = _get(_get(diagnosis, "error"), "kind")
    if facts.interrupted:
        return Stop("interrupted; the saved states are kept", status="interrupted")
    if facts.exit_status == 0 and facts.final_model and Path(facts.final_model).name:
        if state.probe:
            return Retry(config=dict(config), resume_from=None, changes=[],
                         reason=f"the {state.total_steps}-step probe fit; starting the full run", move=None,
                         start_step=0)
        return Stop("training finished", status="success")
    if facts.exit_status == 0:
        error = _get(diagnosis, "error") or {}
        why = _get(error, "message") or "no final model file was written"
        return Stop(f"the trainer exited normally but wrote no final model: {why}",
                    advice=tuple(_get(diagnosis, "advice") or ()))
    if facts.hung:
        return Stop(f"the trainer printed nothing for {facts.hang_minutes or DEFAULT_HANG_MINUTES:g} minutes "
                    f"(hang at step {facts.end_step}); it was stopped",
                    advice=("A stuck data loader or a deadlocked multi-GPU setup are the usual causes; "
                            "try --set max_data_loader_n_workers=0, then --continue.",))
    ram = facts.killed or outcome == "ram" or error_kind in ("cpu_oom", "killed")
    if outcome != "oom" and not ram:
        error = _get(diagnosis, "error") or {}
        kind = _get(error, "kind") or "error"
        message = _get(error, "message") or f"exit status {facts.exit_status}"
        return Stop(f"the trainer failed with a {kind} error, not out of memory: {message}; "
                    "this is not retried", advice=tuple(_get(diagnosis, "advice") or ()))
    if state.attempts_left <= 0:
        what = "host RAM ran out" if ram else "out of memory"
        return Stop(f"{what} again and no attempts are left (--max-attempts); every attempt is in the report")

    resumable = state.newest_state is not None and not state.probe
    target_batch = effective_batch(state.plan_config)

    if ram:
        move = ram_changes(config, family, state.tried)
        if move is None:
            return Stop("host RAM ran out (the process was killed with signal 9) and no RAM-saving setting is left",
                        advice=("Close other programs, add swap, or train on a machine with more RAM.",))
        name, changes, why = move
        return _retry(config, changes, name, f"host RAM ran out {_when(facts.end_step)}: {why}", state,
                      resume_ok=True, target_batch=target_batch)

    if _is_sampling(phase):
        changes = sampling_changes(config)
        if changes and "sample_less" not in state.tried:
            return _retry(config, changes, "sample_less",
                          "out of memory while generating sample images: sampling is off for the rest of the run "
                          "(training itself fit); make previews after training", state, resume_ok=True,
                          target_batch=target_batch)
    if next_step is None:
        from kohya_tuner import ladder

        next_step = ladder.next_step
    need = deficit_gib(_get(diagnosis, "oom"))
    where = phase_words(phase)
    lphase = ladder_phase(phase)
    step = None
    if resumable:
        step = next_step(dict(config), family, phase=lphase, deficit_gib=need, policy=state.policy,
                         dataset=dataset, tried=set(state.tried), require_resume_safe=True)
        if step is not None and resume_unsafe(_step_changes(step)):
            step = None
    if step is None:
        step = next_step(dict(config), family, phase=lphase, deficit_gib=need, policy=state.policy,
                         dataset=dataset, tried=set(state.tried), require_resume_safe=False)
    if step is None:
        return Stop(f"out of memory{where} {_when(facts.end_step)}, and the memory ladder has no cheaper setting "
                    "left for this model (its floor is reached)",
                    advice=("A smaller model family, a card with more memory, or --set with settings outside the "
                            "ladder (e.g. a lower resolution) are what is left.",), can_continue=False)
    changes = _step_changes(step)
    figures = f", {need:.2f} GiB short" if need else ""
    saved = _get(step, "saved_gib")
    what = str(_get(step, "move")).replace("+", " + ")
    gain = f", which saves about {saved:.2f} GiB by the estimate" if isinstance(saved, (int, float)) and saved > 0 else ""
    reason = f"out of memory{where} {_when(facts.end_step)}{figures}: {what}{gain}"
    safe = bool(_get(step, "resume_safe")) and not resume_unsafe(changes)
    return _retry(config, changes, str(_get(step, "move")), reason, state, resume_ok=safe,
                  target_batch=target_batch, dataset=dataset)


def _retry(config: Mapping[str, Any], changes, move: str, reason: str, state: RunState, *, resume_ok: bool,
           target_batch: int, dataset: Mapping[str, Any] | None = None) -> Retry:
    ds_changes = [c for c in changes if str(c[0]).startswith("dataset:")]
    changes = [c for c in changes if not str(c[0]).startswith("dataset:")]
    new_dataset = None
    if ds_changes and dataset is not None:
        from kohya_tuner.ladder import apply_step

        _, new_dataset = apply_step({}, _Changes(ds_changes), dict(dataset))
    new = apply_changes(config, changes)
    note = None
    if "train_batch_size" in {c[0] for c in changes} and "gradient_accumulation_steps" not in {c[0] for c in changes}:
        new, why = keep_effective_batch(new, target_batch)
        note = why
    new = {k: v for k, v in new.items() if k not in BOOKKEEPING}
    all_changes = diff_configs(config, new)
    resume_from = None
    start = 0
    if state.probe:
        pass
    elif state.newest_state is None:
        note = _join(note, "no saved state yet, so it starts from step 0")
    elif not resume_ok or resume_unsafe(all_changes):
        keys = ", ".join(resume_unsafe(all_changes)) or "a setting the saved state depends on"
        note = _join(note, f"restarts from step 0: {keys} changed, which a saved state cannot follow "
                           f"(the state at step {state.newest_state.step} is kept but not used)")
    else:
        resume_from = state.newest_state.path
        start = state.newest_state.step
        note = _join(note, f"resumes from the state at step {start}")
    all_changes += [Change(str(k), old, v) for k, old, v in ds_changes]
    return Retry(config=new, resume_from=resume_from, changes=all_changes, reason=reason, move=move,
                 start_step=start, note=note, dataset=new_dataset)


@dataclass(frozen=True)
class _Changes:
    changes: list


def _join(a: str | None, b: str) -> str:
    return f"{a}; {b}" if a else b


# ---- progress bookkeeping (pure, fed with parser events) -------------------------------------


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
        if total is not None and total != self.total_steps - self.start_step and total == self.total_steps:
            # A bar over the whole run (no skipping) counts from zero.
            self.start_step = 0
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
            step = self.step
            m = _STATE_STEP.search(path.rstrip("/\\"))
            if m:
                named = int(m.group(1))
                if self.start_step <= named <= self.total_steps:
                    step = max(step, named)
            rec = StateRecord(path=path, step=step, attempt=self.attempt)
            self.states = [s for s in self.states if s.path != path] + [rec]
            return rec
        if path.endswith((".safetensors", ".ckpt", ".pt")) and "-step" not in Path(path).name and not re.search(
                r"-\d{6}\.(safetensors|ckpt|pt)$", path):
            self.final_model = path
        return None


# ---- the loop ----------------------------------------------------------------------------------


@dataclass
class RunSettings:
    """Everything the loop needs that does not change between attempts (run.json)."""

    out_dir: Path
    family: Family
    script: Path
    dataset_file: Path | None
    plan_config: dict[str, Any]
    total_steps: int
    python: str
    num_processes: int = 1
    gpu_ids: tuple[int, ...] = ()
    gpu_index: int = 0
    accelerate_config: Path | None = None
    cpu: bool = False
    emulate_vram_gb: float | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    hang_minutes: float = DEFAULT_HANG_MINUTES
    probe_steps: int | None = None
    policy: str = "default"
    gpu: dict[str, Any] | None = None
    predicted_gib: float | None = None
    dataset: dict[str, Any] | None = None
    model: str = ""
    job: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1, "model": self.model or self.family.name, "family": self.family.name, "job": self.job,
            "script": str(self.script), "dataset_file": str(self.dataset_file) if self.dataset_file else None,
            "plan_config": self.plan_config, "total_steps": self.total_steps, "python": self.python,
            "num_processes": self.num_processes, "gpu_ids": list(self.gpu_ids), "gpu_index": self.gpu_index,
            "accelerate_config": str(self.accelerate_config) if self.accelerate_config else None, "cpu": self.cpu,
            "emulate_vram_gb": self.emulate_vram_gb, "max_attempts": self.max_attempts,
            "hang_minutes": self.hang_minutes, "probe_steps": self.probe_steps, "policy": self.policy,
            "gpu": self.gpu, "predicted_gib": self.predicted_gib, "dataset": self.dataset,
        }

    @classmethod
    def from_json(cls, out_dir: Path, data: dict[str, Any]) -> "RunSettings":
        from kohya_tuner.families import get_family

        return cls(
            out_dir=out_dir, family=get_family(data["family"]), script=Path(data["script"]),
            dataset_file=Path(data["dataset_file"]) if data.get("dataset_file") else None,
            plan_config=data["plan_config"], total_steps=int(data["total_steps"]), python=data["python"],
            num_processes=int(data.get("num_processes") or 1), gpu_ids=tuple(data.get("gpu_ids") or ()),
            gpu_index=int(data.get("gpu_index") or 0),
            accelerate_config=Path(data["accelerate_config"]) if data.get("accelerate_config") else None,
            cpu=bool(data.get("cpu")), emulate_vram_gb=data.get("emulate_vram_gb"),
            max_attempts=int(data.get("max_attempts") or DEFAULT_MAX_ATTEMPTS),
            hang_minutes=float(data.get("hang_minutes") or DEFAULT_HANG_MINUTES),
            probe_steps=data.get("probe_steps"), policy=data.get("policy") or "default", gpu=data.get("gpu"),
            predicted_gib=data.get("predicted_gib"), dataset=data.get("dataset"), model=data.get("model") or "",
            job=data.get("job") or "",
        )


@dataclass(frozen=True)
class RunEvent:
    """One thing that happened, for the live display and --json-events."""

    kind: str  # attempt_start, progress, saved, milestone, oom, attempt_end, decision, finished, line
    data: dict[str, Any]


@dataclass
class Outcome:
    status: str  # success, failed, interrupted
    reason: str
    summary: dict[str, Any]
    attempts: list[AttemptRecord]
    exit_code: int


def launch_spec(settings: RunSettings, config_file: Path, mixed_precision: str, dataset_file: Path | None = None):
    from kohya_tuner.launcher import LaunchSpec

    return LaunchSpec(script=settings.script, config_file=config_file,
                      dataset_config=dataset_file or settings.dataset_file,
                      python=settings.python, mixed_precision=mixed_precision or "no",
                      num_processes=settings.num_processes, gpu_ids=settings.gpu_ids,
                      accelerate_config=settings.accelerate_config, cpu=settings.cpu)


def command_for(settings: RunSettings, config_file: Path, config: Mapping[str, Any],
                base_env: Mapping[str, str] | None = None, dataset_file: Path | None = None
                ) -> tuple[list[str], dict[str, str]]:
    from kohya_tuner import launcher

    argv = launcher.build_argv(launch_spec(settings, config_file, str(config.get("mixed_precision") or "no"),
                                           dataset_file))
    single = settings.num_processes <= 1
    # One process: pin the card through CUDA_VISIBLE_DEVICES. Several: accelerate's
    # --gpu_ids does it for each process.
    env = launcher.build_env(os.environ if base_env is None else base_env,
                             gpu_ids=settings.gpu_ids if single else (),
                             emulate_vram_gb=settings.emulate_vram_gb)
    if settings.gpu_ids and not single:
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    return argv, env


def probe_config(config: Mapping[str, Any], steps: int, out_dir: Path) -> dict[str, Any]:
    """A short trial run: same memory settings, its own output folder, no states."""
    out = {k: v for k, v in config.items() if k not in BOOKKEEPING}
    out["max_train_steps"] = steps
    out.pop("max_train_epochs", None)
    out["output_dir"] = str(out_dir / "probe")
    out["output_name"] = "probe"
    for key in ("save_state", "save_every_n_steps", "save_last_n_steps_state", "save_every_n_epochs",
                "save_last_n_steps"):
        out.pop(key, None)
    return out


class Supervisor:
    """Runs attempts until success, a non-OOM failure, the ladder's floor or --max-attempts."""

    def __init__(self, settings: RunSettings, *, on_event: Callable[[RunEvent], None] | None = None,
                 events_file: Path | None = None, stop: threading.Event | None = None,
                 base_env: Mapping[str, str] | None = None, sampler_factory: Callable[[int], Any] | None = None,
                 next_step: Callable[..., Any] | None = None):
        self.s = settings
        self.journal = Journal(settings.out_dir)
        self.on_event = on_event or (lambda e: None)
        self.events_file = events_file
        self.stop = stop or threading.Event()
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.sampler_factory = sampler_factory
        self.next_step = next_step
        self._events_fh = None
        self.dataset = settings.dataset
        self.dataset_file = settings.dataset_file
        self._adopt_changed_dataset()

    # -- events --

    def emit(self, kind: str, /, **data: Any) -> None:
        ev = RunEvent(kind, data)
        if self._events_fh is not None:
            import json

            self._events_fh.write(json.dumps({"event": kind, "time": jr.now_iso(), **data}, ensure_ascii=False,
                                             default=str) + "\n")
            self._events_fh.flush()
        self.on_event(ev)

    # -- files --

    def write_attempt_config(self, attempt: int, config: Mapping[str, Any], why: str) -> Path:
        from kohya_tuner import config_io

        path = self.journal.config_path(attempt)
        header = (f"Attempt {attempt} of a kohya-tuner run ({self.s.family.script}).\n{why}\n"
                  "Written by the supervisor; your own config files are never edited.")
        text = config_io.dumps_config(dict(config), script=self.s.family.script, header=header)
        config_io.write_new(path, text, force=True)
        return path

    # -- the loop --

    def run(self, first: Retry, *, first_attempt: int = 1, probe_first: bool = False) -> Outcome:
        """Run from `first` (the first attempt's settings) until a Stop."""
        if self.events_file is not None:
            self.events_file.parent.mkdir(parents=True, exist_ok=True)
            self._events_fh = open(self.events_file, "a", encoding="utf-8")
        try:
            return self._loop(first, first_attempt, probe_first)
        finally:
            if self._events_fh is not None:
                self._events_fh.close()
                self._events_fh = None

    def _loop(self, first: Retry, attempt: int, probing: bool) -> Outcome:
        history = self.journal.attempts()
        launched = 0
        plan = replace(first, config=dict(first.config), changes=list(first.changes))
        tried = {a.move for a in history if a.move}
        stop: Stop | None = None
        while True:
            launched += 1
            record, diagnosis, facts = self._attempt(attempt, plan, probing)
            history.append(record)
            if not probing and record.start_step == 0:
                self._adopt_reported_total(record)
            newest = self._newest_state(history)
            stored = None
            if newest is not None:
                ts = jr.read_train_state(newest.path)
                stored = int(ts["current_step"]) if ts and isinstance(ts.get("current_step"), int) else None
            state = RunState(attempt=attempt, attempts_left=self.s.max_attempts - launched,
                             total_steps=self.s.probe_steps if probing else self.s.total_steps,
                             plan_config=self.s.plan_config, tried=frozenset(tried), newest_state=newest,
                             stored_step=stored, probe=probing, policy=self.s.policy)
            action = decide(diagnosis, plan.config, self.s.family, state, facts, dataset=self.dataset,
                            next_step=self.next_step)
            if isinstance(action, Stop):
                stop = action
                self.emit("decision", action="stop", status=action.status, reason=action.reason,
                          advice=list(action.advice))
                break
            if probing and facts.exit_status == 0:
                probing = False
                action = Retry(config=dict(action.config), resume_from=None, changes=[], reason=action.reason,
                               start_step=0, note="the full run starts from step 0 with the settings the probe proved")
            elif action.move:
                tried.add(action.move)
            if "max_train_epochs" in action.config:
                # Steps, not epochs, stay fixed across retries: a batch or resolution move
                # changes how many steps an epoch has.
                cfg = {k: v for k, v in action.config.items() if k != "max_train_epochs"}
                cfg["max_train_steps"] = self.s.total_steps
                action = replace(action, config=cfg)
            self.emit("decision", action="retry", reason=action.reason, move=action.move,
                      changes=[c.__dict__ for c in action.changes], resume_from=action.resume_from, note=action.note)
            plan = action
            attempt += 1
        return self._finish(history, stop)

    def _adopt_changed_dataset(self) -> None:
        """A continued run keeps the dataset file a move wrote in an earlier attempt."""
        found = []
        for p in self.s.out_dir.glob("attempt-*.dataset.toml"):
            m = re.match(r"attempt-(\d+)\.dataset\.toml$", p.name)
            if m:
                found.append((int(m.group(1)), p))
        if not found:
            return
        from kohya_tuner import config_io

        path = max(found)[1]
        self.dataset = config_io.read_dataset(path)
        self.dataset_file = path

    def _adopt_reported_total(self, record: AttemptRecord) -> None:
        """With max_train_epochs the trainer decides the step count; its report wins."""
        reported = record.total_steps
        if reported and reported != self.s.total_steps:
            self.s.total_steps = int(reported)
            cfg = {k: v for k, v in self.s.plan_config.items() if k != "max_train_epochs"}
            cfg["max_train_steps"] = int(reported)
            self.s.plan_config = cfg
            self.journal.write_run(self.s.to_json())

    def _newest_state(self, attempts: list[AttemptRecord]) -> StateRecord | None:
        newest = jr.newest_state(_lineage(attempts))
        if newest is not None and newest.step >= self.s.total_steps:
            return None
        return newest

    def _attempt(self, attempt: int, plan: Retry, probing: bool) -> tuple[AttemptRecord, Any, AttemptFacts]:
        from kohya_tuner import launcher, logparse

        out = self.s.out_dir
        total = self.s.probe_steps if probing else self.s.total_steps
        config = probe_config(plan.config, total, out) if probing else plan.config
        stored = None
        if plan.resume_from:
            ts = jr.read_train_state(plan.resume_from)
            stored = ts.get("current_step") if ts else None
        run_config = attempt_config(config, resume_from=plan.resume_from, resume_step=plan.start_step,
                                    stored_step=stored)
        cfg_path = self.write_attempt_config(attempt, run_config, plan.reason)
        if plan.dataset is not None and plan.dataset != self.dataset:
            from kohya_tuner import config_io

            self.dataset = dict(plan.dataset)
            self.dataset_file = self.s.out_dir / f"attempt-{attempt}.dataset.toml"
            config_io.write_new(self.dataset_file, config_io.dumps_dataset(
                self.dataset, header=f"Dataset config from attempt {attempt} on (a move changed it)."), force=True)
        argv, env = command_for(self.s, cfg_path, run_config, self.base_env, dataset_file=self.dataset_file)
        log_path = self.journal.log_path(attempt)
        if log_path.exists():
            log_path.unlink()  # a stale log of an attempt that never got journaled
        record = AttemptRecord(attempt=attempt, started=jr.now_iso(), config_file=str(cfg_path),
                               log_file=str(log_path), reason=plan.reason, changes=list(plan.changes),
                               move=plan.move, resume_from=plan.resume_from, probe=probing,
                               start_step=plan.start_step, end_step=plan.start_step, total_steps=total,
                               note=plan.note)
        self.emit("attempt_start", attempt=attempt, reason=plan.reason, note=plan.note, probe=probing,
                  changes=[c.__dict__ for c in plan.changes], resume_from=plan.resume_from,
                  start_step=plan.start_step, total_steps=total, command=launcher.format_command(argv),
                  config_file=str(cfg_path), log_file=str(log_path))
        progress = Progress(start_step=plan.start_step, total_steps=total, attempt=attempt)
        # One parser per pipe: a traceback (stderr) stays contiguous even when a stdout
        # line such as an epoch header lands between two of its lines.
        parsers = {"stdout": logparse.LogParser(), "stderr": logparse.LogParser()}
        events: list[Any] = []
        killed = {"seen": False}
        sampler = self._sampler()

        def handle(ev: Any) -> None:
            events.append(ev)
            kind = type(ev).__name__
            if kind == "Progress":
                progress.on_progress(ev.step, getattr(ev, "total", None), getattr(ev, "loss", None),
                                     getattr(ev, "rate", None))
                self.emit("progress", attempt=attempt, step=progress.step, total=total, loss=progress.loss,
                          rate=progress.rate, eta_s=progress.eta_s, vram_gib=_now(sampler),
                          peak_gib=_peak(sampler))
            elif kind == "Saved":
                rec = progress.on_saved(ev.what, str(ev.path))
                self.emit("saved", attempt=attempt, what=ev.what, path=str(ev.path),
                          step=rec.step if rec else progress.step)
            elif kind == "Oom":
                self.emit("oom", attempt=attempt, step=progress.step, figures=_as_dict(ev.figures))
            elif kind in _PASSED_ON:
                data = _as_dict(ev)
                if kind == "TotalSteps":
                    progress.reported_total = data.get("total")
                if kind == "Failure":
                    data["error_kind"] = data.pop("kind", None)
                self.emit(_PASSED_ON[kind], attempt=attempt, **data)

        def on_line(stream: str, line: str) -> None:
            if _KILLED.search(line):
                killed["seen"] = True
            for ev in parsers.get(stream, parsers["stdout"]).feed(line + "\n"):
                handle(ev)

        def tick() -> None:
            if sampler is not None and sampler.samples:
                self.emit("vram", attempt=attempt, vram_gib=_now(sampler), peak_gib=_peak(sampler))

        if sampler is not None:
            sampler.start()
        try:
            result = launcher.run_process(argv, env, on_line=on_line, log_path=log_path,
                                          hang_timeout_s=self.s.hang_minutes * 60, stop=self.stop, tick=tick,
                                          tick_s=1.0)
        finally:
            if sampler is not None:
                sampler.stop()
        for p in parsers.values():
            for ev in p.finish():
                handle(ev)
        exit_status = result.exit_status
        diagnosis = logparse.diagnose(events, exit_status=exit_status, family=self.s.family.name)
        final = progress.final_model
        if final is None:
            guess = Path(config.get("output_dir") or ".") / (
                f"{config.get('output_name') or 'last'}.{config.get('save_model_as') or 'safetensors'}")
            final = str(guess)
        final_exists = Path(final).is_file()
        facts = AttemptFacts(exit_status=exit_status, end_step=progress.step, hung=result.hung,
                             interrupted=result.interrupted, killed=killed["seen"] or exit_status in (137, -9),
                             final_model=final if final_exists and exit_status == 0 else None,
                             hang_minutes=self.s.hang_minutes)
        if progress.reported_total and not probing and not plan.resume_from:
            record.total_steps = int(progress.reported_total)
        record.duration_s = round(result.duration_s, 2)
        record.exit_status = exit_status
        record.end_step = progress.step
        record.states = progress.states
        record.loss = jr.thin(progress.losses)
        if sampler is not None:
            record.vram = jr.thin([[round(t, 2), round(v, 3)] for t, v in sampler.samples])
            record.peak_vram_gib = round(sampler.peak_gib, 3) if sampler.peak_gib is not None else None
        outcome = _get(diagnosis, "outcome") or "incomplete"
        if result.interrupted:
            outcome = "interrupted"
        elif result.hung:
            outcome = "hang"
        elif facts.killed and outcome != "oom":
            outcome = "ram"
        elif exit_status == 0 and facts.final_model:
            outcome = "success"
        elif exit_status == 0:
            outcome = "incomplete"
        record.outcome = outcome
        record.phase = _get(diagnosis, "phase")
        record.oom = _as_dict(_get(diagnosis, "oom")) or None
        record.error = _as_dict(_get(diagnosis, "error")) or None
        record.advice = list(_get(diagnosis, "advice") or [])
        record.final_model = facts.final_model
        self.journal.append(record)
        self.emit("attempt_end", attempt=attempt, outcome=outcome, phase=record.phase, exit_status=exit_status,
                  steps=f"{record.start_step}->{record.end_step}", peak_gib=record.peak_vram_gib,
                  duration_s=record.duration_s, error=record.error, oom=record.oom)
        return record, diagnosis, facts

    def _sampler(self):
        if self.sampler_factory is not None:
            return self.sampler_factory(self.s.gpu_index)
        if self.s.cpu:
            return None
        from kohya_tuner.gpu import VramSampler, list_gpus

        if not list_gpus():
            return None
        return VramSampler(index=self.s.gpu_ids[0] if self.s.gpu_ids else self.s.gpu_index, interval=1.0)

    def _finish(self, attempts: list[AttemptRecord], stop: Stop | None) -> Outcome:
        from kohya_tuner import report

        stop = stop or Stop("stopped")
        last = attempts[-1] if attempts else None
        final_config = None
        if last is not None:
            final_config = _read_config_file(last.config_file)
        lora = last.final_model if last is not None and stop.status == "success" else None
        cont = (f"kohya-tuner run --continue {_quote(self.s.out_dir)}"
                if stop.status != "success" and stop.can_continue else None)
        history_note = None
        if stop.status == "success" and last is not None:
            history_note = self._append_history(last, final_config or {})
        summary = jr.summarize([a for a in attempts], status=stop.status, reason=stop.reason,
                               total_steps=self.s.total_steps, final_config=final_config,
                               plan_config=self.s.plan_config, lora_path=lora, gpu=self.s.gpu,
                               continue_command=cont, history_note=history_note)
        summary["advice"] = list(stop.advice)
        summary["predicted_gib"] = self.s.predicted_gib
        summary["report"] = str(self.journal.report_path)
        self.journal.write_summary(summary)
        self.journal.write_report(report.render(summary, attempts, title=f"kohya-tuner run: {self.s.out_dir.name}"))
        code = {"success": 0, "interrupted": 130}.get(stop.status, 1)
        self.emit("finished", **{k: summary[k] for k in ("status", "reason", "lora", "attempts", "failed_attempts",
                                                         "time_lost_s", "steps_lost", "peak_vram_gib",
                                                         "continue_command", "report")})
        return Outcome(status=stop.status, reason=stop.reason, summary=summary, attempts=attempts, exit_code=code)

    def _append_history(self, last: AttemptRecord, config: dict[str, Any]) -> str | None:
        gpu = self.s.gpu or {}
        if last.peak_vram_gib is None or not gpu.get("name"):
            return "not recorded: no VRAM measurement (NVML unavailable)"
        if self.s.emulate_vram_gb is not None:
            return "not recorded: the card was emulated (--emulate-vram)"
        if self.s.predicted_gib is None:
            return "not recorded: there was no prediction to compare with"
        from kohya_tuner import history, memory

        # The prediction for the settings that actually ran (after any downgrades), made
        # without the history correction, so the history never corrects itself.
        predicted = memory.estimate(config, self.s.family, dataset=self.s.dataset,
                                    gpus=max(1, self.s.num_processes)).peak_gib
        entry = {
            "gpu_name": gpu.get("name"), "gpu_total_gib": gpu.get("total_gib"), "model": self.s.family.name,
            "fingerprint": history.fingerprint(config, self.s.family, self.s.dataset),
            "predicted_gib": round(predicted, 3), "measured_peak_gib": last.peak_vram_gib,
        }
        history.append(entry)
        return f"measured peak {last.peak_vram_gib:.2f} GiB recorded for {gpu.get('name')}"


# Parser events passed on to the display and --json-events, by the names they go out as.
# The trainer's `model saved.` is "model_saved": "finished" is the whole run's last event.
_PASSED_ON = {"Milestone": "milestone", "Resumed": "resumed", "Failure": "failure", "TotalSteps": "total_steps",
              "EpochStart": "epoch", "Finished": "model_saved", "Exited": "exited"}


def _lineage(attempts: list[AttemptRecord]) -> list[AttemptRecord]:
    """The attempts since the last one that started from step 0 (probes excluded):
    states from before a restart belong to other settings."""
    runs = [a for a in attempts if not a.probe]
    start = 0
    for i, a in enumerate(runs):
        if a.resume_from is None and a.start_step == 0:
            start = i
    return runs[start:]


def continuation(attempts: list[AttemptRecord], settings: RunSettings, *,
                 next_step: Callable[..., Any] | None = None) -> Retry | Stop:
    """How `run --continue` picks up: after an OOM, the decision the loop would have made;
    after an interruption, a hang or an error, the same settings from the newest state."""
    if not attempts:
        return Retry(config=ensure_resumable(settings.plan_config, settings.total_steps), resume_from=None,
                     changes=[], reason="the fitted plan (started with --continue)")
    last = attempts[-1]
    config = _read_config_file(last.config_file) or dict(settings.plan_config)
    if last.probe:
        config = {k: v for k, v in config.items() if k not in ("max_train_steps", "output_dir", "output_name")}
        config = ensure_resumable({**settings.plan_config, **config,
                                   "output_dir": settings.plan_config.get("output_dir"),
                                   "output_name": settings.plan_config.get("output_name"),
                                   "max_train_steps": settings.total_steps}, settings.total_steps)
    lineage = _lineage(attempts)
    newest = jr.newest_state(lineage)
    orphan = _unjournaled_state(settings, newest)
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


def _unjournaled_state(settings: RunSettings, newest: StateRecord | None) -> StateRecord | None:
    """A state written after the journal's last record: kohya-tuner itself was killed
    mid-attempt (a closed terminal, kill -9) while the trainer kept saving. Its step is the
    trainer's own `train_state.json` count, the best there is without the journal."""
    out = settings.plan_config.get("output_dir")
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


def _read_config_file(path: str) -> dict[str, Any] | None:
    import toml

    from kohya_tuner.config_io import flatten

    try:
        cfg = flatten(toml.load(path))
    except (OSError, toml.TomlDecodeError):
        return None
    return {k: v for k, v in cfg.items() if k not in BOOKKEEPING}


def _quote(path: Path) -> str:
    from kohya_tuner.launcher import format_command

    return format_command([str(path)])


def _now(sampler) -> float | None:
    return getattr(sampler, "now_gib", None) if sampler is not None else None


def _peak(sampler) -> float | None:
    return getattr(sampler, "peak_gib", None) if sampler is not None else None


def _as_dict(obj: Any) -> dict[str, Any]:
    if obj is None:
        return {}
    if isinstance(obj, Mapping):
        return dict(obj)
    if hasattr(obj, "to_json"):
        try:
            return dict(obj.to_json())
        except Exception:
            pass
    if hasattr(obj, "model_dump"):
        return obj.model_dump()
    if hasattr(obj, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(obj)
    return {"value": str(obj)}


def free_disk_gib(path: Path) -> float | None:
    p = Path(path)
    while not p.exists() and p.parent != p:
        p = p.parent
    try:
        return shutil.disk_usage(p).free / 1024**3
    except OSError:
        return None
