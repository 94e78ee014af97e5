"""Resumable states: the resume keys an attempt runs with, and which state a relaunch uses.

States from before a restart from step 0 belong to other settings and are never resumed
into; a state written after the journal's last record (kohya-tuner itself was killed
while the trainer kept saving) is found on disk.
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from kohya_tuner import safeio
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


def attempt_name(base: str, attempt: int) -> str:
    """The output_name attempt N writes under: its states and LoRA files never share a name
    with another attempt's, so nothing is written over and sd-scripts' pruning of old states
    (by name and step) never reaches a state another attempt wrote. The first attempt keeps
    the plan's name, so a run without failures leaves what the plan (and its launch.sh) says."""
    return base if attempt == 1 else f"{base}-attempt{attempt}"


def base_name(config: Mapping[str, Any]) -> str:
    return str(config.get("output_name") or "last")


def attempt_config(config: Mapping[str, Any], *, resume_from: str | None, resume_step: int,
                   total_steps: int | None = None, attempt: int | None = 1,
                   stored_step: int | None = None, weights_from: str | None = None) -> dict[str, Any]:
    """The config an attempt runs with: the settings plus the supervisor's resume keys.

    A resumed attempt runs as a run of its own of the remaining steps: `resume` loads the
    weights, optimizer, scheduler and RNG; `initial_step = 0` stops the pinned sd-scripts
    from using the state's step count (its skip arithmetic restarts the counter past an
    epoch boundary and mixes units with gradient accumulation, so it trains too many or
    too few steps); `max_train_steps` is what is left, so the trainer stops at the planned
    total. The scheduler's horizon is rescaled to keep the learning rate on the planned
    curve (see `continue_schedule`). docs/run.md has the measurements behind this.

    `weights_from` (a move the state cannot follow, such as another optimizer): the attempt
    loads those LoRA weights (`network_weights`) with a fresh optimizer and scheduler and
    trains the steps left after `resume_step`, on the schedule `fresh_schedule` gives."""
    del stored_step  # the state's own counter plays no part any more (kept for older callers)
    if total_steps is None:
        total_steps = int(config.get("max_train_steps") or 0)
    out = {k: v for k, v in config.items() if k not in BOOKKEEPING}
    if attempt is not None:
        out["output_name"] = attempt_name(base_name(config), attempt)
    if resume_from:
        left = total_steps - resume_step
        if left < 1:
            raise ValueError(f"nothing left to train after step {resume_step} of {total_steps}")
        out["resume"] = resume_from
        out["initial_step"] = 0
        out.pop("max_train_epochs", None)
        out["max_train_steps"] = left
        out.update(continue_schedule(config, total_steps, left))
    elif weights_from:
        left = total_steps - resume_step
        if left < 1:
            raise ValueError(f"nothing left to train after step {resume_step} of {total_steps}")
        out["network_weights"] = weights_from
        out.pop("max_train_epochs", None)
        out["max_train_steps"] = left
        out.update(fresh_schedule(config, total_steps, resume_step))
    return out


_LR_KEYS = ("learning_rate", "unet_lr", "text_encoder_lr")


def fresh_schedule(config: Mapping[str, Any], total_steps: int, done: int) -> dict[str, Any]:
    """Scheduler settings for a fresh scheduler that trains steps done+1..total_steps: what is
    left of the warmup, and for a half-cosine the learning rates scaled to where the planned
    curve is at `done`, so the new curve runs from there down to 0 (same ends, a cosine
    shape over the remaining steps). Constant schedules continue as planned."""
    sched = str(config.get("lr_scheduler") or "constant")
    out: dict[str, Any] = {}
    warm = config.get("lr_warmup_steps")
    warm = int(warm * total_steps) if isinstance(warm, float) else int(warm or 0)
    if warm:
        out["lr_warmup_steps"] = max(0, warm - done)
    if sched == "cosine" and not config.get("lr_scheduler_type") and done >= warm:
        cycles = 0.5
        for a in config.get("lr_scheduler_args") or []:
            if str(a).startswith("num_cycles="):
                cycles = float(str(a).split("=", 1)[1])
        if cycles == 0.5:
            import math

            factor = 0.5 * (1 + math.cos(math.pi * (done - warm) / max(1, total_steps - warm)))
            for key in _LR_KEYS:
                value = config.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    out[key] = value * factor
                elif isinstance(value, list) and all(isinstance(v, (int, float)) for v in value):
                    out[key] = [v * factor for v in value]
    return out


def fresh_schedule_note(config: Mapping[str, Any]) -> str | None:
    """Why the learning rate of an attempt continued from weights leaves the planned curve."""
    sched = str(config.get("lr_scheduler") or "constant")
    if sched in ("constant", "constant_with_warmup") and not config.get("lr_scheduler_type"):
        return None
    if sched == "cosine" and not config.get("lr_scheduler_type"):
        args = [a for a in config.get("lr_scheduler_args") or [] if str(a).startswith("num_cycles=")]
        if not args or args == ["num_cycles=0.5"]:
            return None
    return f"the {sched} schedule starts over for the remaining steps (a fresh scheduler)"


def continue_schedule(config: Mapping[str, Any], total_steps: int, left: int) -> dict[str, Any]:
    """Scheduler settings that keep the learning rate on the planned curve when the trainer
    is told the run has `left` steps instead of `total_steps`.

    sd-scripts builds the schedule from `max_train_steps` (x processes) and the state restores
    only the scheduler's position, so the horizon follows the relaunch's max_train_steps.
    Warmup given as a fraction becomes a step count of the planned run; a cosine curve gets
    `num_cycles` scaled by the horizon ratio (the curve depends on progress x num_cycles
    only). Constant schedules need nothing. Others (linear, polynomial, restarts, a custom
    type) cannot be rescaled through settings: the `schedule_note` says so."""
    sched = str(config.get("lr_scheduler") or "constant")
    procs = 1  # both horizons scale with the process count; the ratio does not
    out: dict[str, Any] = {}
    warm = config.get("lr_warmup_steps")
    if isinstance(warm, float):
        warm = int(warm * total_steps * procs)
        out["lr_warmup_steps"] = warm
    warm = int(warm or 0)
    if sched == "cosine" and not config.get("lr_scheduler_type"):
        args = [a for a in (config.get("lr_scheduler_args") or []) if not str(a).startswith("num_cycles=")]
        cycles = 0.5
        for a in config.get("lr_scheduler_args") or []:
            if str(a).startswith("num_cycles="):
                cycles = float(str(a).split("=", 1)[1])
        scaled = cycles * max(1, left * procs - warm) / max(1, total_steps * procs - warm)
        out["lr_scheduler_args"] = args + [f"num_cycles={scaled!r}"]
    return out


RESCALED_SCHEDULES = ("constant", "constant_with_warmup", "cosine", "inverse_sqrt")


def schedule_note(config: Mapping[str, Any]) -> str | None:
    """Why the learning rate of a resumed attempt leaves the planned curve, or None."""
    sched = str(config.get("lr_scheduler") or "constant")
    if config.get("lr_scheduler_type"):
        return f"lr_scheduler_type {config.get('lr_scheduler_type')} restarts its own schedule on resume"
    if sched.startswith("adafactor") or sched in RESCALED_SCHEDULES:
        return None
    return (f"the {sched} schedule is compressed into the remaining steps (sd-scripts sizes it from "
            "max_train_steps; only constant, warmup and cosine schedules can be rescaled)")


def settings_of(run_config: Mapping[str, Any], plan_config: Mapping[str, Any]) -> dict[str, Any]:
    """An attempt's settings from the config it ran with: the keys `attempt_config`
    rewrites come back from the plan (the memory ladder never moves them)."""
    out = {k: v for k, v in run_config.items() if k not in BOOKKEEPING and k not in REWRITTEN}
    for k in REWRITTEN:
        if k in plan_config:
            out[k] = plan_config[k]
    return out


# Keys attempt_config sets per attempt besides the resume keys.
REWRITTEN = ("output_name", "max_train_steps", "max_train_epochs", "lr_scheduler_args", "lr_warmup_steps",
             "network_weights") + _LR_KEYS


# ---- states on disk -------------------------------------------------------------------------

# What accelerate writes into a state folder; random_states comes last, after the model,
# optimizer and scheduler, so a folder that has it was not cut short by a crash.
_STATE_FILES = ("model.safetensors", "optimizer.bin", "scheduler.bin")


def state_complete(state_dir: str | os.PathLike) -> bool:
    """A state folder sd-scripts can resume from: train_state.json parses, the LoRA weights,
    optimizer and scheduler files are whole (their own length fields check out) and the
    random states, written last, are there."""
    d = Path(state_dir)
    ts = jr.read_train_state(d)
    if not ts or jr.valid_step(ts.get("current_step")) is None:
        return False
    if not _safetensors_whole(d / "model.safetensors"):
        return False
    for name in ("optimizer.bin", "scheduler.bin"):
        if not _torch_file_whole(d / name):
            return False
    return any(p.stat().st_size > 0 for p in d.glob("random_states_*.pkl"))


def _safetensors_whole(path: Path) -> bool:
    try:
        # A run folder's files are read like a user's: a FIFO or a device link never blocks.
        with safeio.open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            n = int.from_bytes(f.read(8), "little")
            if n <= 0 or 8 + n > size:
                return False
            header = json.loads(f.read(n))
    except (OSError, ValueError):
        return False
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)
            and isinstance(v.get("data_offsets"), list) and len(v["data_offsets"]) == 2]
    return size >= 8 + n + max(ends, default=0)


def _torch_file_whole(path: Path) -> bool:
    """torch.save writes a zip archive, whose central directory is at the end of the file:
    a file cut short starts like a zip but does not open as one."""
    try:
        with safeio.open_regular(path) as f:
            magic = f.read(4)
            if not magic:
                return False
            if magic != b"PK\x03\x04":
                return True  # the legacy format has no length to check; non-empty is the best there is
            with zipfile.ZipFile(f) as z:
                return bool(z.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


@dataclass(frozen=True)
class AttemptOutput:
    """Where one attempt of this run writes: its output_name, and the absolute optimizer step
    its trainer counts from (a resumed attempt counts from 0)."""

    attempt: int
    name: str
    start_step: int


def states_on_disk(output_dir: str | os.PathLike | None, attempts: list[AttemptOutput],
                   total_steps: int | None = None) -> list[StateRecord]:
    """Every complete state folder the given attempts wrote, with its absolute step (the
    attempt's start plus the trainer's own count in train_state.json), oldest first. Log
    lines play no part: with console_log_level = "WARNING" there are none."""
    if not output_dir or not Path(output_dir).is_dir():
        return []
    by_prefix = sorted(attempts, key=lambda a: len(a.name), reverse=True)
    found: list[StateRecord] = []
    for d in Path(output_dir).iterdir():
        if not d.name.endswith("-state") or not d.is_dir():
            continue
        owner = next((a for a in by_prefix if _owned(d.name, a.name)), None)
        if owner is None or not state_complete(d):
            continue
        ts = jr.read_train_state(d) or {}
        step = owner.start_step + int(ts["current_step"])
        if total_steps is not None and step > total_steps:
            continue  # a count past the plan is a damaged or foreign file, not progress
        found.append(StateRecord(path=str(d), step=step, attempt=owner.attempt))
    return sorted(found, key=lambda s: (s.step, s.attempt))


def _owned(folder: str, name: str) -> bool:
    """`<name>-state`, `<name>-step00000012-state` or `<name>-000003-state` (sd-scripts' names)."""
    if folder == f"{name}-state":
        return True
    rest = folder[len(name):] if folder.startswith(name + "-") else None
    if rest is None:
        return False
    mid = rest[1:-len("-state")]
    return (mid.startswith("step") and mid[4:].isdigit()) or (mid.isdigit() and len(mid) == 6)


def newest_resumable(output_dir: str | os.PathLike | None, attempts: list[AttemptOutput],
                     total_steps: int) -> StateRecord | None:
    """The newest complete state before the end of the run (a final state has nothing left)."""
    states = [s for s in states_on_disk(output_dir, attempts, total_steps) if 0 < s.step < total_steps]
    return states[-1] if states else None


def attempt_outputs(attempts: list[AttemptRecord], base: str) -> list[AttemptOutput]:
    return [AttemptOutput(a.attempt, attempt_name(base, a.attempt), a.start_step) for a in attempts]


def lineage(attempts: list[AttemptRecord]) -> list[AttemptRecord]:
    """The attempts since the last one that did not resume a state (probes excluded): it
    started from step 0, or from saved LoRA weights with a fresh optimizer; states from
    before it belong to other settings (another optimizer's state)."""
    runs = [a for a in attempts if not a.probe]
    start = 0
    for i, a in enumerate(runs):
        if a.resume_from is None:
            start = i
    return runs[start:]


def lineage_weights(attempts: list[AttemptRecord]) -> StateRecord | None:
    """The LoRA weights the current lineage started from, when it continued from saved weights
    with a fresh optimizer (no state resumed, a start past step 0): path and absolute step."""
    runs = lineage(attempts)
    if not runs or runs[0].resume_from is not None or runs[0].start_step <= 0:
        return None
    import toml

    from kohya_tuner.config_io import flatten

    try:
        weights = flatten(toml.load(runs[0].config_file)).get("network_weights")
    except (OSError, ValueError, TypeError, IndexError, RecursionError):
        return None
    if not isinstance(weights, str) or not Path(weights).is_file():
        return None
    return StateRecord(path=weights, step=runs[0].start_step, attempt=runs[0].attempt)


def publish_lora(path: str, base: str, metadata: Mapping[str, str] | None = None) -> tuple[str, str | None]:
    """Put the finished LoRA at `<output_dir>/<output_name>.<ext>`, the name the plan gave it,
    without writing over anything: a hard link (a copy where links are not possible) when
    that name is free, the attempt's own file when something else already holds it.

    `metadata` (safetensors only) is written into that copy's header: a resumed attempt's
    trainer stamps its own step count as `ss_steps`, not the run's."""
    src = Path(path)
    dest = src.with_name(base + src.suffix)
    if dest == src:
        return str(src), None
    if dest.exists():
        if dest.is_file() and _same_tensors(dest, src):
            return str(dest), None
        return str(src), f"{dest} already exists and is not this run's LoRA; it was left as it is"
    tmp = dest.with_name(dest.name + ".part")
    if metadata and src.suffix == ".safetensors" and restamp_safetensors(src, tmp, metadata):
        os.replace(tmp, dest)
        return str(dest), None
    try:
        os.link(src, dest)
    except OSError:
        import shutil

        shutil.copy2(src, tmp)
        os.replace(tmp, dest)
    return str(dest), None


def _same_tensors(a: Path, b: Path) -> bool:
    """Same file, or the same tensor bytes (a restamped copy differs only in its header)."""
    try:
        if _whole(a) == _whole(b):
            return True
    except OSError:
        return False
    ha, hb = _header(a), _header(b)
    if ha is None or hb is None:
        return False
    (na, ja), (nb, jb) = ha, hb
    ja.pop("__metadata__", None)
    jb.pop("__metadata__", None)
    try:
        return ja == jb and _whole(a)[8 + na:] == _whole(b)[8 + nb:]
    except OSError:
        return False


def _whole(path: Path) -> bytes:
    with safeio.open_regular(path) as f:
        return f.read()


def _header(path: Path) -> tuple[int, dict] | None:
    try:
        with safeio.open_regular(path) as f:
            n = int.from_bytes(f.read(8), "little")
            if n <= 0 or 8 + n > os.fstat(f.fileno()).st_size:
                return None
            header = json.loads(f.read(n))
    except (OSError, ValueError):
        return None
    return (n, header) if isinstance(header, dict) else None


def restamp_safetensors(src: Path, dest: Path, metadata: Mapping[str, str]) -> bool:
    """Copy a .safetensors file with `metadata` merged into its header (tensor bytes as they
    were). False when the source is not a readable safetensors file."""
    if not _safetensors_whole(src):
        return False
    head = _header(src)
    if head is None:
        return False
    n, header = head
    meta = dict(header.get("__metadata__") or {})
    meta.update({str(k): str(v) for k, v in metadata.items()})
    header["__metadata__"] = meta
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # the format allows space padding; 8-byte alignment for the data
    with safeio.open_regular(src) as f, open(dest, "wb") as out:
        f.seek(8 + n)
        out.write(len(raw).to_bytes(8, "little"))
        out.write(raw)
        for block in iter(lambda: f.read(1 << 20), b""):
            out.write(block)
    return True


def settle_unfinished(attempts: list[AttemptRecord], plan_config: Mapping[str, Any],
                      total_steps: int) -> list[AttemptRecord]:
    """Attempts whose end the journal never saw (kohya-tuner was killed: only the record
    written at launch is left) get the progress their complete states on disk prove,
    counted against the plan, so steps done and redone are right after a SIGKILL."""
    from dataclasses import replace

    base = base_name(plan_config)
    out = []
    for a in attempts:
        if a.outcome in jr.UNFINISHED and not a.probe:
            found = states_on_disk(plan_config.get("output_dir"),
                                   [AttemptOutput(a.attempt, attempt_name(base, a.attempt), a.start_step)],
                                   total_steps)
            if found and found[-1].step > a.end_step:
                known = {s.path for s in a.states}
                a = replace(a, end_step=found[-1].step, states=list(a.states) + [s for s in found if s.path not in known])
        out.append(a)
    return out
